package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/arenaplan/arenaplan/cmd/internal/famreport"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/plans"
	"github.com/arenaplan/arenaplan/workloads"
)

// parseBatchSizes reads "1,2,4": distinct positive sizes, in the order
// given.
func parseBatchSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("--batch-sizes %q: %q is not a positive integer", s, f)
		}
		if slices.Contains(out, v) {
			return nil, fmt.Errorf("--batch-sizes %q: %d appears twice", s, v)
		}
		out = append(out, v)
	}
	return out, nil
}

// familyGraphs builds the workload at each batch size, with the tensors
// the members share sized for the largest.
func familyGraphs(name string, base workloads.Shape, sizes []int) ([]*graph.Graph, error) {
	mb := slices.Max(sizes)
	var gs []*graph.Graph
	for _, b := range sizes {
		s := base
		s.Batch, s.MaxBatch = b, mb
		g, err := workloads.Build(name, s)
		if err != nil {
			return nil, err
		}
		gs = append(gs, g)
	}
	return gs, nil
}

// planFamily plans the workload at every --batch-sizes size into one
// family arena and writes one family plan file.
func planFamily(ctx context.Context, c config, stdout io.Writer) error {
	sizes, err := parseBatchSizes(c.batchSizes)
	if err != nil {
		return usageError{err}
	}
	gs, err := familyGraphs(c.workload, c.shape.Shape(), sizes)
	if err != nil {
		return usageError{err} // a shape the flags gave
	}
	fp, members, err := graph.PlanFamily(ctx, c.algo, gs, planner.Options{Align: c.align, Budget: c.budget, Workers: c.workers})
	if err != nil {
		return err
	}
	fam := &plans.Family{Members: members, Plan: fp}
	for _, g := range gs {
		w := g.Workload()
		fam.Workloads = append(fam.Workloads, w)
	}
	if c.out != "" {
		if err := plans.SaveFamily(c.out, fam); err != nil {
			return err
		}
	}
	r := famreport.NewFamilyReport(fam)
	if c.jsonOut {
		line, err := json.Marshal(r)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", line)
		return nil
	}
	fmt.Fprintf(stdout, "family of %s at batch sizes %s, planned in %.1f ms\n", c.workload, c.batchSizes, millis(fp.Elapsed))
	return r.WriteText(stdout)
}

func inspectFamily(path string, fam *plans.Family, asJSON bool, stdout io.Writer) error {
	r := famreport.NewFamilyReport(fam)
	if asJSON {
		line, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", line)
		return err
	}
	fmt.Fprintf(stdout, "file %s: a family of %d members, check passed\n", path, len(fam.Members))
	return r.WriteText(stdout)
}

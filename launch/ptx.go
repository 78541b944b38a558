package launch

import (
	"bytes"
	"regexp"
)

var (
	entryRE  = regexp.MustCompile(`(?m)^(?:\.visible\s+)?\.entry\s+([A-Za-z_$][\w$]*)\s*\(`)
	targetRE = regexp.MustCompile(`(?m)^\.target\s+sm_(\d+)`)
)

// Target returns the sm_NN number of ptx's .target directive (80 for
// compute_80 PTX, 90 for compute_90), or 0 when there is none.
func Target(ptx []byte) int {
	m := targetRE.FindSubmatch(ptx)
	if m == nil {
		return 0
	}
	n := 0
	for _, c := range m[1] {
		n = 10*n + int(c-'0')
	}
	return n
}

// PDLEntries returns the entries of ptx whose body executes
// griddepcontrol.wait: kernels that may be launched with programmatic
// serialization (cuda.LaunchConfig.ProgrammaticSerialization), because
// their source has them wait for the previous kernel before they touch
// memory it writes or reads. Empty for compute_80 PTX, which has no such
// instruction.
func PDLEntries(ptx []byte) map[string]bool {
	out := map[string]bool{}
	locs := entryRE.FindAllSubmatchIndex(ptx, -1)
	for i, loc := range locs {
		end := len(ptx)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		if bytes.Contains(ptx[loc[1]:end], []byte("griddepcontrol.wait")) {
			out[string(ptx[loc[2]:loc[3]])] = true
		}
	}
	return out
}

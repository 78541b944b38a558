package cuda

import (
	"fmt"
	"reflect"
)

// simNode is one node of a simulated graph.
type simNode struct {
	id     GraphNode
	typ    NodeType
	deps   []*simNode
	key    string // what an exec update must keep: "kernel", "memset", ...
	params any
	run    func(*Sim) error
}

type simGraph struct {
	sim     *Sim
	nodes   []*simNode // creation order, which is a topological order
	byID    map[GraphNode]*simNode
	capture *simCapture // while the capture that builds it is underway
	closed  bool
}

func (g *simGraph) add(n *simNode) {
	g.nodes = append(g.nodes, n)
	g.byID[n.id] = n
}

type simCapture struct {
	id      uint64
	mode    CaptureMode
	status  CaptureStatus
	origin  *simStream
	graph   *simGraph
	streams map[*simStream]bool
	thread  int // the OS thread that began it (currentThread)
}

func (s *Sim) BeginCapture(st Stream, mode CaptureMode) error {
	const op = "cuStreamBeginCapture_v2"
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.stream(op, st)
	if err != nil {
		return err
	}
	if ss.capture != nil {
		return &Error{Op: op, Code: ErrorIllegalState}
	}
	if ss.foreign && ss.handle == 0 {
		return &Error{Op: op, Code: ErrorStreamCaptureUnsupported} // the legacy stream
	}
	if mode < CaptureModeGlobal || mode > CaptureModeRelaxed {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	c := &simCapture{id: s.nextCapID, mode: mode, status: CaptureActive, origin: ss, thread: currentThread(),
		streams: map[*simStream]bool{ss: true}}
	s.nextCapID++
	c.graph = &simGraph{sim: s, byID: map[GraphNode]*simNode{}, capture: c}
	s.captures[c] = true
	ss.capture, ss.frontier = c, nil
	return nil
}

func (s *Sim) EndCapture(st Stream) (Graph, error) {
	const op = "cuStreamEndCapture"
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.stream(op, st)
	if err != nil {
		return nil, err
	}
	c := ss.capture
	if c == nil {
		return nil, &Error{Op: op, Code: ErrorIllegalState}
	}
	if c.origin != ss {
		c.status = CaptureInvalidated
		return nil, &Error{Op: op, Code: ErrorStreamCaptureUnmatched}
	}
	code := Success
	if c.status == CaptureInvalidated {
		code = ErrorStreamCaptureInvalidated
	} else if !c.joined() {
		code = ErrorStreamCaptureUnjoined
	}
	for t := range c.streams {
		t.capture, t.frontier = nil, nil
	}
	delete(s.captures, c)
	c.graph.capture = nil
	if code != Success {
		c.graph.closed = true
		return nil, &Error{Op: op, Code: code}
	}
	return c.graph, nil
}

// joined reports whether every stream that forked from the origin has
// joined back: each of its terminal nodes precedes an origin terminal.
func (c *simCapture) joined() bool {
	reach := map[*simNode]bool{}
	var walk func(n *simNode)
	walk = func(n *simNode) {
		if reach[n] {
			return
		}
		reach[n] = true
		for _, d := range n.deps {
			walk(d)
		}
	}
	for _, n := range c.origin.frontier {
		walk(n)
	}
	for t := range c.streams {
		for _, n := range t.frontier {
			if !reach[n] {
				return false
			}
		}
	}
	return true
}

func (s *Sim) CaptureInfo(st Stream) (CaptureInfo, error) {
	const op = "cuStreamGetCaptureInfo_v3"
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.stream(op, st)
	if err != nil {
		return CaptureInfo{}, err
	}
	c := ss.capture
	if c == nil {
		return CaptureInfo{Status: CaptureNone}, nil
	}
	if c.status != CaptureActive {
		return CaptureInfo{Status: c.status, ID: c.id}, nil
	}
	info := CaptureInfo{Status: c.status, ID: c.id, Graph: c.graph}
	for _, n := range ss.frontier {
		info.Terminals = append(info.Terminals, n.id)
	}
	return info, nil
}

func (s *Sim) UpdateCaptureDependencies(st Stream, nodes []GraphNode, mode DepsMode) error {
	const op = "cuStreamUpdateCaptureDependencies_v2"
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.stream(op, st)
	if err != nil {
		return err
	}
	c := ss.capture
	if c == nil {
		return &Error{Op: op, Code: ErrorIllegalState}
	}
	if c.status == CaptureInvalidated {
		return &Error{Op: op, Code: ErrorStreamCaptureInvalidated}
	}
	var ns []*simNode
	for _, id := range nodes {
		n, ok := c.graph.byID[id]
		if !ok {
			return &Error{Op: op, Code: ErrorInvalidValue}
		}
		ns = append(ns, n)
	}
	switch mode {
	case DepsAdd:
		ss.frontier = unionNodes(ss.frontier, ns)
	case DepsSet:
		ss.frontier = unionNodes(nil, ns)
	default:
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	return nil
}

// ---- graphs ----

func (g *simGraph) live(op string) error {
	if err := g.sim.live(op); err != nil {
		return err
	}
	if g.closed {
		return &Error{Op: op, Code: ErrorInvalidHandle}
	}
	return nil
}

func (g *simGraph) node(op string, id GraphNode) (*simNode, error) {
	if err := g.live(op); err != nil {
		return nil, err
	}
	n, ok := g.byID[id]
	if !ok {
		return nil, &Error{Op: op, Code: ErrorInvalidValue}
	}
	return n, nil
}

func (g *simGraph) Nodes() ([]GraphNode, error) {
	g.sim.mu.Lock()
	defer g.sim.mu.Unlock()
	if err := g.live("cuGraphGetNodes"); err != nil {
		return nil, err
	}
	out := make([]GraphNode, len(g.nodes))
	for i, n := range g.nodes {
		out[i] = n.id
	}
	return out, nil
}

func (g *simGraph) Dependencies(id GraphNode) ([]GraphNode, error) {
	g.sim.mu.Lock()
	defer g.sim.mu.Unlock()
	n, err := g.node("cuGraphNodeGetDependencies_v2", id)
	if err != nil {
		return nil, err
	}
	out := make([]GraphNode, len(n.deps))
	for i, d := range n.deps {
		out[i] = d.id
	}
	return out, nil
}

func (g *simGraph) NodeType(id GraphNode) (NodeType, error) {
	g.sim.mu.Lock()
	defer g.sim.mu.Unlock()
	n, err := g.node("cuGraphNodeGetType", id)
	if err != nil {
		return 0, err
	}
	return n.typ, nil
}

func (g *simGraph) AddEmptyNode(deps []GraphNode) (GraphNode, error) {
	const op = "cuGraphAddEmptyNode"
	s := g.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := g.live(op); err != nil {
		return 0, err
	}
	n := &simNode{typ: NodeEmpty, key: "empty"}
	for _, id := range deps {
		d, ok := g.byID[id]
		if !ok {
			return 0, &Error{Op: op, Code: ErrorInvalidValue}
		}
		n.deps = unionNodes(n.deps, []*simNode{d})
	}
	n.id = s.nextNode
	s.nextNode++
	g.add(n)
	return n.id, nil
}

func (g *simGraph) Close() error {
	s := g.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := g.live("cuGraphDestroy"); err != nil {
		return err
	}
	if g.capture != nil {
		return &Error{Op: "cuGraphDestroy", Code: ErrorIllegalState}
	}
	g.closed = true
	return nil
}

// simExec is an instantiated graph: a snapshot of the nodes, with each
// node's dependencies as indices into the snapshot.
type simExec struct {
	sim    *Sim
	closed bool
	nodes  []*simNode
	deps   [][]int
}

func (g *simGraph) Instantiate(flags InstantiateFlags) (Exec, error) {
	const op = "cuGraphInstantiateWithFlags"
	s := g.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := g.live(op); err != nil {
		return nil, err
	}
	if g.capture != nil {
		return nil, &Error{Op: op, Code: ErrorIllegalState}
	}
	if flags&^(InstantiateAutoFreeOnLaunch|InstantiateUpload|InstantiateUseNodePriority) != 0 {
		return nil, &Error{Op: op, Code: ErrorInvalidValue}
	}
	x := &simExec{sim: s}
	x.nodes, x.deps = g.snapshot()
	return x, nil
}

func (g *simGraph) snapshot() ([]*simNode, [][]int) {
	index := make(map[*simNode]int, len(g.nodes))
	nodes := make([]*simNode, len(g.nodes))
	deps := make([][]int, len(g.nodes))
	for i, n := range g.nodes {
		index[n] = i
		c := *n
		nodes[i] = &c
		for _, d := range n.deps {
			deps[i] = append(deps[i], index[d])
		}
	}
	return nodes, deps
}

func (x *simExec) live(op string) error {
	if err := x.sim.live(op); err != nil {
		return err
	}
	if x.closed {
		return &Error{Op: op, Code: ErrorInvalidHandle}
	}
	return nil
}

func (x *simExec) Launch(st Stream) error {
	const op = "cuGraphLaunch"
	s := x.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := x.live(op); err != nil {
		return err
	}
	ss, err := s.stream(op, st)
	if err != nil {
		return err
	}
	nodes := append([]*simNode(nil), x.nodes...)
	n := &simNode{typ: NodeGraph, key: "graph", params: nodes}
	n.run = func(s *Sim) error {
		for _, n := range nodes {
			if err := s.runNode(n); err != nil {
				return fmt.Errorf("cuda: sim graph replay: %w", err)
			}
		}
		return nil
	}
	return s.enqueue(op, ss, n)
}

func (x *simExec) Update(gr Graph) (UpdateResult, error) {
	const op = "cuGraphExecUpdate_v2"
	s := x.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := x.live(op); err != nil {
		return UpdateError, err
	}
	g, ok := gr.(*simGraph)
	if !ok || g.sim != s {
		return UpdateError, &Error{Op: op, Code: ErrorInvalidHandle}
	}
	if err := g.live(op); err != nil {
		return UpdateError, err
	}
	nodes, deps := g.snapshot()
	fail := func(r UpdateResult) (UpdateResult, error) {
		return r, &Error{Op: op, Code: ErrorGraphExecUpdateFailure}
	}
	if len(nodes) != len(x.nodes) {
		return fail(UpdateTopologyChanged)
	}
	for i, n := range nodes {
		if !reflect.DeepEqual(deps[i], x.deps[i]) {
			return fail(UpdateTopologyChanged)
		}
		if n.typ != x.nodes[i].typ {
			return fail(UpdateNodeTypeChanged)
		}
		if n.key != x.nodes[i].key {
			return fail(UpdateFunctionChanged)
		}
	}
	x.nodes = nodes
	return UpdateSuccess, nil
}

func (x *simExec) Close() error {
	x.sim.mu.Lock()
	defer x.sim.mu.Unlock()
	if err := x.live("cuGraphExecDestroy"); err != nil {
		return err
	}
	x.closed = true
	return nil
}

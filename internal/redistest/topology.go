package redistest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Node is one process of a topology that StartCluster or StartSentinel
// started: a redis-server, a replica or a Sentinel, on a private loopback
// port. Every node is killed at the test's cleanup.
type Node struct {
	// Addr is the node's host:port.
	Addr string

	dir    string
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has exited
	mu     sync.Mutex
	down   bool // killed or paused: no longer asked about the topology
}

// nodeStarts is how many ports a node tries: another process may take a
// free port between our probe and the server's bind.
const nodeStarts = 5

// startNode starts bin with args() after its own port, address, directory
// and log file, on a free loopback port, retrying on another port (and new
// args) if the process exits before it answers. conf, when not empty, is
// written to a config file that goes first on the command line (Sentinel
// rewrites it).
func startNode(t testing.TB, bin, conf string, args func() []string) *Node {
	t.Helper()
	if _, err := exec.LookPath(bin); err != nil {
		missing(t, bin+" on PATH")
	}
	var err error
	for range nodeStarts {
		n := &Node{dir: t.TempDir(), exited: make(chan struct{})}
		port := freePort(t)
		n.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		var argv []string
		if conf != "" {
			file := filepath.Join(n.dir, "node.conf")
			if err = os.WriteFile(file, []byte(conf), 0o600); err != nil {
				break
			}
			argv = append(argv, file)
		}
		argv = append(argv, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", n.dir, "--logfile", filepath.Join(n.dir, "redis.log"))
		n.cmd = exec.Command(bin, append(argv, args()...)...)
		DieWithParent(n.cmd)
		if err = n.cmd.Start(); err != nil {
			break
		}
		go func() { n.cmd.Wait(); close(n.exited) }()
		if err = n.await(10 * time.Second); err == nil {
			t.Cleanup(n.Kill)
			return n
		}
		n.Kill()
	}
	t.Fatalf("redistest: %s did not start: %v", bin, err)
	return nil
}

// await waits until the node answers PING, or reports why it will not.
func (n *Node) await(d time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		select {
		case <-n.exited:
			log, _ := os.ReadFile(filepath.Join(n.dir, "redis.log"))
			return fmt.Errorf("exited on %s: %s", n.Addr, lastLines(log, 3))
		default:
		}
		if c.Ping(context.Background()).Err() == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no answer on %s after %v", n.Addr, d)
}

// Kill ends the node with SIGKILL (a crash: nothing is flushed) and waits
// for it to exit. Killing a dead node does nothing.
func (n *Node) Kill() {
	n.setDown()
	if n.cmd.Process != nil {
		n.cmd.Process.Kill()
		<-n.exited
	}
}

// Pause stops the node with SIGSTOP: its port still accepts connections
// but nothing answers, as with a stalled server. Resume undoes it.
func (n *Node) Pause(t testing.TB) {
	t.Helper()
	n.setDown()
	if err := signalStop(n.cmd.Process); err != nil {
		t.Fatalf("redistest: pause %s: %v", n.Addr, err)
	}
}

// Resume continues a paused node (SIGCONT).
func (n *Node) Resume(t testing.TB) {
	t.Helper()
	if err := signalCont(n.cmd.Process); err != nil {
		t.Fatalf("redistest: resume %s: %v", n.Addr, err)
	}
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
}

func (n *Node) setDown() {
	n.mu.Lock()
	n.down = true
	n.mu.Unlock()
}

func (n *Node) isDown() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.down
}

// client returns a short-lived client of the node for the helpers' own
// questions. It never retries, so a dead node fails at once (the helpers
// skip killed and paused nodes); its timeouts allow for a busy machine.
func (n *Node) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1,
		DialTimeout: 3 * time.Second, ReadTimeout: 3 * time.Second})
}

// dataArgs configure a data node: nothing on disk, and a replica's first
// sync at once rather than after diskless sync's 5 s gathering delay.
var dataArgs = []string{"--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"}

func data() []string { return slices.Clone(dataArgs) }

// ClusterOptions configures StartCluster. A nil *ClusterOptions gives every
// default.
type ClusterOptions struct {
	// Masters is how many masters share the 16384 slots. Default 3.
	Masters int
	// Replicas is how many replicas each master has. Default 0.
	Replicas int
	// NodeTimeout is cluster-node-timeout: how long a master may be
	// unreachable before the cluster fails it over. Default 1 s.
	NodeTimeout time.Duration
	// Args are extra redis-server arguments for every node, such as
	// "--cluster-require-full-coverage", "no". Default: none.
	Args []string
}

// Cluster is a private Redis Cluster started by StartCluster.
type Cluster struct {
	// Nodes are every node, masters and replicas, in start order.
	Nodes []*Node
}

// StartCluster starts a Redis Cluster on private loopback ports and waits
// until every node reports the cluster ok and every replica is in sync. It
// stops every node at cleanup. A 3-master cluster with one replica each
// takes about two seconds to start.
func StartCluster(t testing.TB, opts *ClusterOptions) *Cluster {
	t.Helper()
	o := ClusterOptions{Masters: 3, NodeTimeout: time.Second}
	if opts != nil {
		if opts.Masters > 0 {
			o.Masters = opts.Masters
		}
		o.Replicas = max(0, opts.Replicas)
		if opts.NodeTimeout > 0 {
			o.NodeTimeout = opts.NodeTimeout
		}
		o.Args = opts.Args
	}
	c := &Cluster{}
	for range o.Masters * (1 + o.Replicas) {
		c.Nodes = append(c.Nodes, startNode(t, "redis-server", "", func() []string {
			// The bus port is named: Redis's default, port+10000, may be
			// past 65535 or taken.
			bus := freePort(t)
			args := append(data(), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-port", strconv.Itoa(bus),
				"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10))
			return append(args, o.Args...)
		}))
	}
	c.create(t, o.Masters)
	c.awaitReady(t, o.Masters, 20*time.Second)
	return c
}

// create gives each master an even share of the slots, introduces every
// node to the first and makes the rest replicas of the masters in turn.
func (c *Cluster) create(t testing.TB, masters int) {
	t.Helper()
	ctx := context.Background()
	do := func(n *Node, args ...any) *redis.Cmd {
		cl := n.client()
		defer cl.Close()
		cmd := cl.Do(ctx, args...)
		if err := cmd.Err(); err != nil {
			t.Fatalf("redistest: %s %v: %v", n.Addr, args, err)
		}
		return cmd
	}
	ids := make([]string, masters)
	for i, n := range c.Nodes[:masters] {
		do(n, "cluster", "addslotsrange", i*16384/masters, (i+1)*16384/masters-1)
		ids[i] = do(n, "cluster", "myid").Val().(string)
	}
	host, port, _ := net.SplitHostPort(c.Nodes[0].Addr)
	bus := do(c.Nodes[0], "config", "get", "cluster-port").Val()
	busPort := fmt.Sprint(bus.(map[any]any)["cluster-port"])
	for _, n := range c.Nodes[1:] {
		do(n, "cluster", "meet", host, port, busPort)
	}
	for i, n := range c.Nodes[masters:] {
		// A replica must know its master before it can follow it.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			cl := n.client()
			err := cl.Do(ctx, "cluster", "replicate", ids[i%masters]).Err()
			cl.Close()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: %s: CLUSTER REPLICATE: %v", n.Addr, err)
			}
		}
	}
}

// Addrs returns every node's address: seeds for a ClusterClient.
func (c *Cluster) Addrs() []string { return addrs(c.Nodes) }

// addrs returns the nodes' addresses, in order.
func addrs(nodes []*Node) []string {
	a := make([]string, len(nodes))
	for i, n := range nodes {
		a[i] = n.Addr
	}
	return a
}

// Client returns a cluster client seeded with every node, closed at
// cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// URL returns the nodes as a --redis URL for sluice serve:
// redis+cluster://first?addr=second&addr=...
func (c *Cluster) URL() string {
	u := "redis+cluster://" + c.Nodes[0].Addr
	for i, n := range c.Nodes[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + n.Addr
	}
	return u
}

// awaitReady waits until every node says cluster_state:ok, knows every
// other node and the owner of every slot, and every replica's link to its
// master is up. With cluster-require-full-coverage no a node says ok before
// it has heard which master owns which slots: a master stopped then never
// tells it, and its CLUSTER SLOTS, which a client may load, leaves them out.
func (c *Cluster) awaitReady(t testing.TB, masters int, d time.Duration) {
	t.Helper()
	var why string
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if why = c.notReady(masters); why == "" {
			return
		}
	}
	t.Fatalf("redistest: cluster not ready: %s", why)
}

func (c *Cluster) notReady(masters int) string {
	ctx := context.Background()
	for _, n := range c.Nodes {
		cl := n.client()
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			cl.Close()
			return err.Error()
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r", len(c.Nodes))) ||
			!strings.Contains(info, "cluster_slots_assigned:16384\r") {
			cl.Close()
			return n.Addr + ": " + lastLines([]byte(info), 20)
		}
		repl, err := cl.Info(ctx, "replication").Result()
		cl.Close()
		if err != nil {
			return err.Error()
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return n.Addr + ": replica not in sync"
		}
	}
	nodes, err := c.nodesView()
	if err != nil {
		return err.Error()
	}
	if got := len(slices.DeleteFunc(nodes, func(e nodeEntry) bool { return !e.master })); got != masters {
		return fmt.Sprintf("%d masters, want %d", got, masters)
	}
	return ""
}

// nodeEntry is one line of CLUSTER NODES.
type nodeEntry struct {
	id, addr, masterID string
	master, failed     bool
	slots              []string
}

// nodesView returns CLUSTER NODES as a live node sees it.
func (c *Cluster) nodesView() ([]nodeEntry, error) {
	var errs error
	for _, n := range c.Nodes {
		if n.isDown() {
			continue
		}
		cl := n.client()
		text, err := cl.ClusterNodes(context.Background()).Result()
		cl.Close()
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		var view []nodeEntry
		for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 {
				continue
			}
			addr, _, _ := strings.Cut(f[1], "@")
			flags := strings.Split(f[2], ",")
			view = append(view, nodeEntry{
				id: f[0], addr: addr, masterID: f[3],
				master: slices.Contains(flags, "master"),
				failed: slices.Contains(flags, "fail") || slices.Contains(flags, "fail?"),
				slots:  f[8:],
			})
		}
		return view, nil
	}
	return nil, errors.Join(errors.New("redistest: no live cluster node"), errs)
}

func (c *Cluster) node(addr string) *Node {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// MasterOf returns the node that serves key's hash slot now, as a live node
// sees it.
func (c *Cluster) MasterOf(t testing.TB, key string) *Node {
	t.Helper()
	var slot int64
	for _, n := range c.Nodes {
		if n.isDown() {
			continue
		}
		cl := n.client()
		var err error
		slot, err = cl.ClusterKeySlot(context.Background(), key).Result()
		cl.Close()
		if err != nil {
			t.Fatalf("redistest: CLUSTER KEYSLOT: %v", err)
		}
		break
	}
	view, err := c.nodesView()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range view {
		if e.master && !e.failed && ownsSlot(e.slots, slot) {
			return c.node(e.addr)
		}
	}
	t.Fatalf("redistest: no master serves slot %d", slot)
	return nil
}

func ownsSlot(ranges []string, slot int64) bool {
	for _, r := range ranges {
		lo, hi, found := strings.Cut(r, "-")
		if !found {
			hi = lo
		}
		a, err1 := strconv.ParseInt(lo, 10, 64)
		b, err2 := strconv.ParseInt(hi, 10, 64)
		if err1 == nil && err2 == nil && a <= slot && slot <= b {
			return true
		}
	}
	return false
}

// ReplicasOf returns master's replicas.
func (c *Cluster) ReplicasOf(t testing.TB, master *Node) []*Node {
	t.Helper()
	view, err := c.nodesView()
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for _, e := range view {
		if e.addr == master.Addr {
			id = e.id
		}
	}
	var out []*Node
	for _, e := range view {
		if id != "" && e.masterID == id {
			out = append(out, c.node(e.addr))
		}
	}
	return out
}

// AwaitMaster polls the live nodes' CLUSTER NODES every 10 ms until one of
// them shows one of candidates as a master that has not failed, and returns
// that node and when it was seen: the moment of promotion, as far as a
// test can tell. It fails the test after d.
func (c *Cluster) AwaitMaster(t testing.TB, d time.Duration, candidates ...*Node) (*Node, time.Time) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		view, err := c.nodesView()
		if err != nil {
			continue
		}
		for _, e := range view {
			for _, n := range candidates {
				if e.addr == n.Addr && e.master && !e.failed {
					return n, time.Now()
				}
			}
		}
	}
	t.Fatalf("redistest: no promotion within %v", d)
	return nil, time.Time{}
}

// SentinelOptions configures StartSentinel. A nil *SentinelOptions gives
// every default.
type SentinelOptions struct {
	// Replicas is how many replicas the master has. Default 1.
	Replicas int
	// Sentinels is how many Sentinels watch the master. Default 3.
	Sentinels int
	// Quorum is how many Sentinels must agree the master is down. Default 2.
	Quorum int
	// DownAfter is down-after-milliseconds: how long the master may be
	// silent before a Sentinel calls it down. Default 1 s.
	DownAfter time.Duration
	// SyncDelay is the replicas' repl-diskless-sync-delay, whole seconds
	// (default 0): once one is promoted, the others' full resync waits
	// for it, and so does the +switch-master of the Sentinel leading a
	// planned failover, seconds after the other Sentinels'.
	SyncDelay time.Duration
}

func (o *SentinelOptions) syncDelay() time.Duration {
	if o == nil {
		return 0
	}
	return o.SyncDelay
}

// SentinelSet is a private master, its replicas and the Sentinels watching
// them as SentinelMaster, started by StartSentinel.
type SentinelSet struct {
	// Master is the master at the start.
	Master *Node
	// Replicas are the master's replicas at the start.
	Replicas []*Node
	// Sentinels watch Master under the name SentinelMaster.
	Sentinels []*Node

	helloOnce sync.Once
	helloFrom string // AnnounceConfig's Sentinel: ip,port,runid
}

// StartSentinel starts a master, its replicas and Sentinels on private
// loopback ports, and waits until the replicas are in sync and every
// Sentinel knows every replica and every other Sentinel (a few seconds:
// Sentinels find each other through hello messages sent every 2 s). It
// stops every process at cleanup.
func StartSentinel(t testing.TB, opts *SentinelOptions) *SentinelSet {
	t.Helper()
	o := SentinelOptions{Replicas: 1, Sentinels: 3, Quorum: 2, DownAfter: time.Second}
	if opts != nil {
		if opts.Replicas > 0 {
			o.Replicas = opts.Replicas
		}
		if opts.Sentinels > 0 {
			o.Sentinels = opts.Sentinels
		}
		if opts.Quorum > 0 {
			o.Quorum = opts.Quorum
		}
		if opts.DownAfter > 0 {
			o.DownAfter = opts.DownAfter
		}
	}
	s := &SentinelSet{Master: startNode(t, "redis-server", "", data)}
	host, port, _ := net.SplitHostPort(s.Master.Addr)
	for range o.Replicas {
		s.Replicas = append(s.Replicas, startNode(t, "redis-server", "", func() []string {
			return append(data(), "--replicaof", host, port, "--repl-diskless-sync-delay", strconv.Itoa(int(opts.syncDelay().Seconds())))
		}))
	}
	// Sentinels that start after the replicas are in sync find them in
	// their first INFO of the master, not ten seconds later.
	s.awaitReplicas(t, 10*time.Second)
	conf := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s %[4]d\n"+
		"sentinel down-after-milliseconds %[1]s %[5]d\n"+
		"sentinel failover-timeout %[1]s 10000\n", SentinelMaster, host, port, o.Quorum, o.DownAfter.Milliseconds())
	for range o.Sentinels {
		s.Sentinels = append(s.Sentinels, startNode(t, "redis-server", conf, func() []string { return []string{"--sentinel"} }))
	}
	s.awaitReady(t, 20*time.Second)
	return s
}

// SentinelAddrs returns the Sentinels' addresses.
func (s *SentinelSet) SentinelAddrs() []string { return addrs(s.Sentinels) }

// URL returns the Sentinels as a --redis URL for sluice serve:
// redis+sentinel://first?master_name=sluice&addr=second&...
func (s *SentinelSet) URL() string {
	u := "redis+sentinel://" + s.Sentinels[0].Addr + "?master_name=" + SentinelMaster
	for _, n := range s.Sentinels[1:] {
		u += "&addr=" + n.Addr
	}
	return u
}

func (s *SentinelSet) awaitReplicas(t testing.TB, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !slices.ContainsFunc(s.Replicas, outOfSync) {
			return
		}
	}
	t.Fatalf("redistest: replicas not in sync after %v", d)
}

func outOfSync(n *Node) bool {
	cl := n.client()
	defer cl.Close()
	repl, err := cl.Info(context.Background(), "replication").Result()
	return err != nil || !strings.Contains(repl, "master_link_status:up")
}

func (s *SentinelSet) awaitReady(t testing.TB, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	var why string
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		why = ""
		for _, n := range s.Sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
			replicas, err1 := sc.Replicas(ctx, SentinelMaster).Result()
			sentinels, err2 := sc.Sentinels(ctx, SentinelMaster).Result()
			sc.Close()
			if err := errors.Join(err1, err2); err != nil {
				why = err.Error()
			} else if len(replicas) < len(s.Replicas) || len(sentinels) < len(s.Sentinels)-1 {
				why = fmt.Sprintf("sentinel %s knows %d replicas and %d sentinels", n.Addr, len(replicas), len(sentinels))
			}
		}
		if why == "" {
			return
		}
	}
	t.Fatalf("redistest: sentinel set not ready: %s", why)
}

// AwaitMaster polls the live Sentinels every 10 ms until one of them names
// one of candidates as the master and that node says it is one, and returns
// that node and when it was seen. It fails the test after d.
func (s *SentinelSet) AwaitMaster(t testing.TB, d time.Duration, candidates ...*Node) (*Node, time.Time) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, sn := range s.Sentinels {
			if sn.isDown() {
				continue
			}
			sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr, MaxRetries: -1})
			addr, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
			sc.Close()
			if err != nil || len(addr) != 2 {
				continue
			}
			for _, n := range candidates {
				if n.Addr != net.JoinHostPort(addr[0], addr[1]) {
					continue
				}
				cl := n.client()
				role, err := cl.Do(ctx, "role").Slice()
				cl.Close()
				if err == nil && len(role) > 0 && role[0] == "master" {
					return n, time.Now()
				}
			}
		}
	}
	t.Fatalf("redistest: no promotion within %v", d)
	return nil, time.Time{}
}

// Pause stops the server with SIGSTOP, as Node.Pause does; Resume, Start
// or Stop ends the pause.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	if err := signalStop(s.cmd.Process); err != nil {
		t.Fatalf("redistest: pause %s: %v", s.Addr, err)
	}
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	if err := signalCont(s.cmd.Process); err != nil {
		t.Fatalf("redistest: resume %s: %v", s.Addr, err)
	}
}

// Failover is a load for UnderFailover: takes from one key with a limit
// that never denies during the test, so that each take's count says which
// server answered it.
type Failover struct {
	// Take takes one unit from the key and returns how many the key has
	// counted, this take included.
	Take func(ctx context.Context) (count int64, err error)
	// Counted returns how many units the key has counted, at the end.
	Counted func() (int64, error)
	// Fail kills the key's master.
	Fail func()
	// Promoted waits for a replica's promotion and returns when it was
	// seen (a Cluster's or a SentinelSet's AwaitMaster).
	Promoted func() time.Time
}

// Failover test bounds: each call's deadline, and how soon after the
// promotion calls must succeed again.
const (
	FailoverCallTimeout = 100 * time.Millisecond
	FailoverRecovery    = 3 * time.Second
)

// failoverTake is one call of UnderFailover's load.
type failoverTake struct {
	end   time.Time
	ok    bool
	count int64
}

// promotedSplit is when the new master's answers begin: the middle of the
// longest pause in successful calls between the kill and at, when the
// promotion was seen. Seen late on a busy machine, at follows the first
// answers of the new master, which counted as the old master's would make
// the takes lost with it look fewer than they are.
func promotedSplit(takes []failoverTake, killed, at time.Time) time.Time {
	ends := []time.Time{killed}
	for _, tk := range takes {
		if tk.ok && tk.end.After(killed) && tk.end.Before(at) {
			ends = append(ends, tk.end)
		}
	}
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	ends = append(ends, at)
	split, longest := at, time.Duration(-1)
	for i := 1; i < len(ends); i++ {
		if gap := ends[i].Sub(ends[i-1]); gap > longest {
			split, longest = ends[i-1].Add(gap/2), gap
		}
	}
	return split
}

// UnderFailover runs f.Take from 8 goroutines, each call with a
// FailoverCallTimeout deadline, kills the master with f.Fail after 500 ms
// and goes on until FailoverRecovery + 500 ms after f.Promoted. It fails
// the test unless calls succeed again within FailoverRecovery of the
// promotion and at most 1% fail after that, and unless the over-admission
// (takes admitted minus takes counted) is at most the takes the old master
// acknowledged that its replica never had: the largest count the old
// master gave, less the one the new master started from.
func UnderFailover(t testing.TB, f Failover) {
	t.Helper()
	const workers = 8
	var (
		mu    sync.Mutex
		takes []failoverTake
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), FailoverCallTimeout)
				count, err := f.Take(ctx)
				cancel()
				mu.Lock()
				takes = append(takes, failoverTake{end: time.Now(), ok: err == nil, count: count})
				mu.Unlock()
				if err != nil {
					time.Sleep(5 * time.Millisecond) // a failing call may return at once: no busy loop
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	f.Fail()
	at := f.Promoted()
	time.Sleep(FailoverRecovery + 500*time.Millisecond)
	close(stop)
	wg.Wait()

	split := promotedSplit(takes, killed, at)
	var (
		firstOK          time.Time
		oldMax           int64 // the largest count the old master gave
		newMin           int64 = math.MaxInt64
		admitted         int64
		failed, tooLate  int
		afterRecovery    int // calls that ended after the recovery deadline
		recoveryDeadline = at.Add(FailoverRecovery)
	)
	for _, tk := range takes {
		if tk.end.After(recoveryDeadline) {
			afterRecovery++
		}
		switch {
		case !tk.ok:
			failed++
			if tk.end.After(recoveryDeadline) {
				tooLate++
			}
		case tk.end.Before(split): // no replica answers before its promotion
			admitted++
			oldMax = max(oldMax, tk.count)
		default:
			admitted++
			newMin = min(newMin, tk.count)
			if !tk.end.Before(at) && (firstOK.IsZero() || tk.end.Before(firstOK)) {
				firstOK = tk.end
			}
		}
	}
	if firstOK.IsZero() {
		t.Fatalf("redistest: no call succeeded after the promotion (%d failed)", failed)
	}
	counted, err := f.Counted()
	if err != nil {
		t.Fatal(err)
	}
	// The replica had newMin-1 when promoted: the old master's takes above
	// that were lost with it.
	lost := max(0, oldMax-(newMin-1))
	excess := admitted - counted
	t.Logf("promoted %v after the kill; calls succeed again %v after the promotion", at.Sub(killed), firstOK.Sub(at))
	t.Logf("%d calls: %d admitted, %d failed; Redis counts %d: over-admission %d; takes the old master acknowledged and its replica never had: %d",
		len(takes), admitted, failed, counted, excess, lost)
	if got := firstOK.Sub(at); got > FailoverRecovery {
		t.Errorf("calls succeed again %v after the promotion, want within %v", got, FailoverRecovery)
	}
	// A call may time out on a healthy server of a busy machine: 1% may.
	if tooLate*100 > afterRecovery {
		t.Errorf("%d of %d calls failed later than %v after the promotion", tooLate, afterRecovery, FailoverRecovery)
	}
	if excess > lost {
		t.Errorf("over-admission %d exceeds the %d takes lost with the old master", excess, lost)
	}
}

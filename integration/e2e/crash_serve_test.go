package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// serveArgs are the flags of a `meshca serve` on s: leaves of at most an
// hour, so that the roots the walk prepares (24 h) outlive them.
func serveArgs(s *crashStore) []string {
	args := append([]string{"--max-ttl", "1h", "--default-ttl", "30m", "--root-lifetime", "24h"}, s.flags...)
	if s.dir != "" {
		args = append(args, "--kubeconfig", cluster.Kubeconfig)
	}
	return args
}

// issuer asks a meshca for SVIDs from a few goroutines, each with a TTL
// one second longer than the last, so that the server records every
// leaf in the CA state before it hands it out. It keeps the leaves it
// got until take.
type issuer struct {
	id   spiffeid.ID
	tok  string
	n    atomic.Int64
	mu   sync.Mutex
	c    *checked.Client
	got  []*x509.Certificate
	all  int
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func (g *issuer) start(workers int) {
	g.stop = make(chan struct{})
	for range workers {
		g.wg.Go(func() {
			for {
				select {
				case <-g.stop:
					return
				default:
				}
				g.mu.Lock()
				c := g.c
				g.mu.Unlock()
				ttl := 2*time.Minute + time.Duration(g.n.Add(1)%3000)*time.Second
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				svid, err := c.Fetch(ctx, g.id, caclient.Options{TTL: ttl})
				cancel()
				if err != nil {
					time.Sleep(10 * time.Millisecond) // the server is down, or being killed
					continue
				}
				g.mu.Lock()
				g.got = append(g.got, svid.Chain[0])
				g.all++
				g.mu.Unlock()
			}
		})
	}
}

// use points the issuer at m, trusting roots.
func (g *issuer) use(t *testing.T, m *harness.Meshca, roots []*x509.Certificate) *checked.Client {
	t.Helper()
	c, err := checked.NewClient(t, caclient.Config{Addr: m.Addr, ServerName: "istiod.istio-system.svc", Roots: certs.Pool(roots...),
		ClusterID: "Kubernetes", TokenFile: g.tok})
	if err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	old := g.c
	g.c = c
	g.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return c
}

// take returns the leaves handed out since the last take.
func (g *issuer) take() []*x509.Certificate {
	g.mu.Lock()
	defer g.mu.Unlock()
	got := g.got
	g.got = nil
	return got
}

// close stops the goroutines; calling it again does nothing.
func (g *issuer) close() {
	g.once.Do(func() {
		close(g.stop)
		g.wg.Wait()
		g.c.Close()
	})
}

// checkRecorded checks that the state covers every leaf handed out: the
// authority that signed it recorded a horizon and a longest lifetime at
// least the leaf's, so that the retire guard cannot drop its root while
// it lives.
func checkRecorded(st *keymgr.State, leaves []*x509.Certificate) error {
	for _, leaf := range leaves {
		var rec *keymgr.AuthorityRecord
		for _, a := range st.Authorities {
			if bytes.Equal(leaf.AuthorityKeyId, a.Cert.SubjectKeyId) && leaf.CheckSignatureFrom(a.Cert) == nil {
				rec = a
			}
		}
		ttl := leaf.NotAfter.Sub(leaf.NotBefore)
		switch {
		case rec == nil:
			return fmt.Errorf("no authority of the state signed a leaf handed out (serial %s)", leaf.SerialNumber)
		case leaf.NotAfter.After(rec.LatestLeafNotAfter) || ttl > rec.LongestLeafTTL:
			return fmt.Errorf("a leaf handed out (not after %s, lifetime %v) is beyond what %.16s recorded (%s, %v)",
				leaf.NotAfter, ttl, rec.ID(), rec.LatestLeafNotAfter, rec.LongestLeafTTL)
		}
	}
	return nil
}

// checkServing checks that m serves st: its reply's bundle holds the
// active root, its leaf is signed by the active authority, and its
// metrics show st's sequence.
func checkServing(t *testing.T, m *harness.Meshca, c *checked.Client, id spiffeid.ID, st *keymgr.State) {
	t.Helper()
	// A leaf shorter than the issuer's: within what is recorded, so that
	// this request need not race theirs to write the state.
	svid, err := c.Fetch(context.Background(), id, caclient.Options{TTL: time.Minute})
	if err != nil {
		t.Fatalf("the restarted server: %v\n%s", err, m.Logs())
	}
	active := st.Active()
	if !slices.ContainsFunc(svid.Roots, active.Root.Equal) {
		t.Fatalf("the restarted server's bundle (%d roots) lacks the active root %.16s", len(svid.Roots), active.ID())
	}
	if err := svid.Chain[0].CheckSignatureFrom(active.Cert); err != nil {
		t.Fatalf("the restarted server signs with another authority than the active %.16s: %v", active.ID(), err)
	}
	r, err := http.Get("http://" + m.AdminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	want := fmt.Sprintf("meshca_trust_bundle_sequence %d", st.Sequence)
	for sc := bufio.NewScanner(r.Body); sc.Scan(); {
		if sc.Text() == want {
			return
		}
	}
	t.Fatalf("the restarted server's metrics lack %q", want)
}

// nextVerb is the rotation step that follows st.
func nextVerb(st *keymgr.State) string {
	has := func(p keymgr.Phase) bool {
		return slices.ContainsFunc(st.Authorities, func(a *keymgr.AuthorityRecord) bool { return a.Phase == p })
	}
	switch {
	case has(keymgr.PhasePrepared):
		return "activate"
	case has(keymgr.PhasePrevious):
		return "retire"
	}
	return "prepare"
}

// startServe runs meshca serve on s until it is ready.
func startServe(t *testing.T, s *crashStore) *harness.Meshca {
	t.Helper()
	m, err := harness.StartMeshcaProcess(bin, serveArgs(s)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Kill)
	return m
}

// serveCommand is `meshca serve` on s, as StartMeshcaProcess runs it.
func serveCommand(s *crashStore) []string {
	return append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"}, serveArgs(s)...)
}

// TestCrashServe kills `meshca serve` with SIGKILL, on a state directory
// and on a Secret of the real apiserver, and restarts it each time:
// first while it starts on an empty store (it bootstraps the first
// root), at points swept over its start-up; then while it serves a
// client that keeps asking for leaves of a new, longer lifetime (so that
// it writes the state before each one), in turn: at points swept over
// the run of a `meshca root` step taken meanwhile (which must succeed: a
// killed server never keeps a lock, and its writes never undo the
// step's); at points swept over half a second; and at points swept over
// a few milliseconds from when it writes (a directory: /proc/locks shows
// it holding the directory's lock) or a step writes (a Secret: /proc
// shows the CLI connected to the apiserver). After every kill the state
// loads and keeps its invariants, goes forward only (sequence,
// authorities, phases, recorded leaves), covers every leaf the client
// got, and the restarted server is ready and serves the active root at
// the stored sequence. (Its --auto-rotate is on, but it looks for a due
// step every 30 s, which no server here lives to see.)
func TestCrashServe(t *testing.T) {
	for _, tt := range []struct {
		kind                  string
		boot, points, workers int
	}{
		{"dir", 4, 8, 2},
		// One client only: meshca's client of the state Secret keeps to
		// client-go's default 5 requests/s, and every leaf here costs 3.
		{"secret", 3, 5, 1},
	} {
		t.Run(tt.kind, func(t *testing.T) {
			start := time.Now()
			ns := cluster.Namespace(t, "crash-serve")
			w := cluster.NewWorkload(t, ns, "web", "node-a")
			c := &serveCrash{s: openCrashStore(t, tt.kind, ns, "serve"), where: tally{},
				g: &issuer{id: workloadID(w), tok: harness.WriteToken(t, w.Token)}}
			c.m = startServe(t, c.s)
			startup := c.m.Started
			t.Logf("meshca serve is ready %v after its start", startup)
			boot := append(spread(tt.boot, 0, 1), randomPoints(t, 1)...)
			for i, f := range boot {
				crashServeStart(t, openCrashStore(t, tt.kind, ns, fmt.Sprintf("boot-%d", i)), time.Duration(f*float64(startup)), c.where)
			}
			c.roots = c.s.load(t).Bundle()
			c.g.use(t, c.m, c.roots)
			c.g.start(tt.workers)
			t.Cleanup(c.g.close)
			for _, f := range append(spread(tt.points, 0, 1), randomPoints(t, 1)...) {
				for kind := range 3 {
					c.kill(t, kind, f)
				}
			}
			c.g.close()
			harness.Report(t, "%d kills (%d during start-up on fresh stores), %d leaves issued, in %v; %v",
				len(boot)+c.kills, len(boot), c.g.all, time.Since(start).Round(time.Millisecond), c.where)
		})
	}
}

// serveCrash is a meshca serve on s under load from g, killed again and
// again.
type serveCrash struct {
	s     *crashStore
	m     *harness.Meshca
	g     *issuer
	roots []*x509.Certificate // every root seen, for the client
	where tally
	kills int
}

// kill kills the server once, at f (in [0, 1]) of the span of the kind
// of kill, checks what it left, and restarts it.
func (c *serveCrash) kill(t *testing.T, kind int, f float64) {
	t.Helper()
	s := c.s
	prev := s.load(t)
	verb := nextVerb(prev)
	var cli *exec.Cmd
	var cliOut bytes.Buffer
	step := func() {
		cli = exec.Command(bin, stepArgs(s, verb)...)
		cli.Stdout, cli.Stderr = &cliOut, &cliOut
		if err := cli.Start(); err != nil {
			t.Fatal(err)
		}
	}
	label := "serve killed under load"
	switch {
	case kind == 0:
		step()
		time.Sleep(time.Duration(f * float64(60*time.Millisecond)))
		label = "serve killed during `meshca root " + verb + "`"
	case kind == 1:
		time.Sleep(time.Duration(f * float64(500*time.Millisecond)))
	case s.dir != "":
		if !waitFor(c.m.Pid(), s.writing()) {
			t.Fatal("the server did not write the state within 5s under load")
		}
		time.Sleep(time.Duration(f * float64(3*time.Millisecond)))
		label = "serve killed writing"
	default:
		step()
		waitFor(cli.Process.Pid, s.writing())
		time.Sleep(time.Duration(f * float64(15*time.Millisecond)))
		label = "serve killed while `meshca root " + verb + "` writes"
	}
	in, held := s.writing(), false
	freezeAndKill(t, c.m.Pid(), c.m.Signal, func(pid int) { held = in(pid) })
	c.m.Kill()
	c.kills++
	if s.dir != "" && held {
		label += ", holding the lock"
	}
	c.where[label]++
	defer func() {
		if t.Failed() {
			t.Logf("(checking kill %d: %s, at %.0f%%)", c.kills, label, 100*f)
		}
	}()
	want := ""
	if cli != nil {
		if err := waitExit(cli, 20*time.Second); err != nil {
			t.Fatalf("meshca root %s while the server was killed: %v\n%s", verb, err, cliOut.String())
		}
		want = verb
	}
	next := s.settled(t)
	if err := checkState(next); err != nil {
		t.Fatal(err)
	}
	if got, err := stepBetween(prev, next); err != nil || got != want {
		t.Fatalf("the state took step %q (%v), want %q", got, err, want)
	}
	leaves := c.g.take()
	if err := checkRecorded(next, leaves); err != nil {
		t.Fatalf("%d leaves since the last kill: %v", len(leaves), err)
	}
	s.checkStatus(t, next)
	if s.dir != "" {
		lookDir(t, s.dir, next)
		checkUnlocked(t, s.dir)
	}
	c.m = startServe(t, s)
	c.roots = append(c.roots, next.Bundle()...)
	checkServing(t, c.m, c.g.use(t, c.m, c.roots), c.g.id, next)
}

// crashServeStart starts meshca serve on the empty store s, kills it
// delay after its start, checks what it left (nothing, or one active
// authority), then starts it again: it must come up on that state.
func crashServeStart(t *testing.T, s *crashStore, delay time.Duration, where tally) {
	t.Helper()
	in, held := s.writing(), false
	if exited, out := killRun(t, delay, nil, func(pid int) { held = in(pid) }, serveCommand(s)...); exited {
		t.Fatalf("meshca serve exited on its own\n%s", out)
	}
	st := s.settled(t)
	switch got, err := stepBetween(nil, st); {
	case err != nil:
		t.Fatalf("serve killed %v after its start: %v", delay, err)
	case got == "":
		where["serve killed in start-up, before the bootstrap"]++
	default:
		if err := checkState(st); err != nil {
			t.Fatalf("serve killed %v after its start: %v", delay, err)
		}
		where["serve killed in start-up, after the bootstrap"]++
	}
	if s.dir != "" && held {
		where["serve killed in start-up, holding the lock"]++
	}
	s.checkStatus(t, st)
	if s.dir != "" {
		lookDir(t, s.dir, st)
		checkUnlocked(t, s.dir)
	}
	m := startServe(t, s)
	defer m.Kill()
	after := s.load(t)
	if err := checkGrowth(st, after); err != nil || st != nil && after.Active().ID() != st.Active().ID() {
		t.Fatalf("the server restarted on a bootstrapped state and changed it: %v", err)
	}
}

// waitExit waits for cmd, at most timeout, and returns its error.
func waitExit(cmd *exec.Cmd, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		return fmt.Errorf("still running after %v: %w", timeout, <-done)
	}
}

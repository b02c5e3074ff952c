package e2e

import (
	"cmp"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/hostile"
	"github.com/meshca/meshca/integration/load"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/secretstore"
)

// The soak's pass criteria (issue 28): every legitimate request served,
// its p99 under attack within soakP99Factor of its p99 without, measured
// in the same run, and each replica's RSS under soakMaxRSS.
const (
	soakP99Factor = 3
	soakMaxRSS    = 200 << 20
)

// soakDurationEnv sets the soak's length: `make soak` runs it for 5
// minutes; `make test` for soakShort. soakAttacksEnv runs only some of
// the attacks (cmd/attack's -kinds), to tell which one does what.
const (
	soakDurationEnv = "MESHCA_SOAK_DURATION"
	soakShort       = 50 * time.Second
	soakAttacksEnv  = "MESHCA_SOAK_ATTACKS"
	// soakStrictEnv, set by `make soak`, makes the latency and memory
	// targets fail the test. In `make test` the soak shares two cores
	// with the rest of the suite, whose load decides its p99 more than
	// meshca does: there it fails on any failed request, probe or
	// aborted phase, and reports the two targets as figures.
	soakStrictEnv = "MESHCA_SOAK_STRICT"
	// soakNiceEnv sets the attacker's nice value (soakAttackerNice when
	// unset; 0 runs it at the replicas' own priority).
	soakNiceEnv = "MESHCA_SOAK_ATTACKER_NICE"
	// soakPprofEnv names a directory: each replica then serves its
	// profiles, and 5 s into each attack replica 0's CPU (30 s) and heap
	// profiles are written there, to see where an attack's cost goes.
	soakPprofEnv = "MESHCA_SOAK_PPROF_DIR"
)

// soakAttackerNice is the attacker's nice value by default: the
// replicas' own priority, so that on one machine the attacker's own CPU
// (about half a core) competes with the replicas and the load generator
// as a hostile Pod's would on their node if it weighed as much as
// meshca's CPU request. A higher value (soakNiceEnv) shows how much of
// the p99 is the machine's run queue rather than meshca's own work
// under the attack (docs/limits.md, Soak).
const soakAttackerNice = 0

// soakPhase is one stretch of the soak and what was measured in it.
type soakPhase struct {
	name string
	d    time.Duration
	// from and sources are the attacker's addresses; none in a phase
	// without attack.
	from    string
	sources int

	lat       *soakLatency
	seen      *soakSeen
	cpu       map[string]time.Duration
	attack    hostile.Line
	attackCPU time.Duration
	// took is how long the phase ran; stopTook how long the attacker
	// then took to close what it held (its requests still count to the
	// phase).
	took, stopTook time.Duration
	aborted        string
}

// soakPhases splits d: a baseline, the attack from one address, a short
// recovery, the attack from 16 addresses, a short recovery.
func soakPhases(d time.Duration) []*soakPhase {
	return []*soakPhase{
		{name: "baseline", d: d / 5},
		{name: "attack from 1 address", d: d * 7 / 20, from: "127.0.2.1", sources: 1},
		{name: "recovery", d: d / 20},
		{name: "attack from 16 addresses", d: d * 7 / 20, from: "127.0.3.1", sources: 16},
		{name: "recovery", d: d / 20},
	}
}

// TestSoak (issue 28): two replicas of `meshca serve` with their
// defaults, on one CA state Secret of the real apiserver, serve a
// ztunnel-shaped load (soak_load_test.go) from addresses of its own,
// first alone (the baseline), then while a hostile process without any
// token (cmd/attack, integration/harness/attack) runs every attack at
// once against both, first from one address and then from 16: half-open
// CreateCertificate streams, health Watches with 60 KiB service names,
// silent TCP connections, TLS handshakes stopped after the ClientHello,
// idle keep-alives to the admin port, each re-opened when the server
// closes it. Every legitimate request must be served and every readiness
// probe answered, the p99 under each attack be within 3× the baseline's,
// and each replica's RSS, sampled every second, stay under 200 MiB.
// MESHCA_SOAK_DURATION sets the length (make soak: 5m).
func TestSoak(t *testing.T) {
	d := soakShort
	if v := os.Getenv(soakDurationEnv); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d < 10*time.Second {
			t.Fatalf("%s=%q: want a duration of 10s or more", soakDurationEnv, v)
		}
	}
	nice := soakAttackerNice
	if v := os.Getenv(soakNiceEnv); v != "" {
		var err error
		if nice, err = strconv.Atoi(v); err != nil || nice < 0 || nice > 19 {
			t.Fatalf("%s=%q: want a nice value from 0 to 19", soakNiceEnv, v)
		}
	}
	kinds := cmp.Or(os.Getenv(soakAttacksEnv), "all")
	if _, err := hostile.ParseKinds(kinds); err != nil {
		t.Fatalf("%s: %v", soakAttacksEnv, err)
	}
	attackBin, err := harness.BuildCommand(t.TempDir(), "./cmd/attack")
	if err != nil {
		t.Fatal(err)
	}
	system, apps := cluster.Namespace(t, "soak-system"), cluster.Namespace(t, "soak-apps")
	replicas, roots := startSoakReplicas(t, system)
	l := newSoakLoad(t, system, apps, replicas, roots)
	l.warm(t)
	obs := newSoakObserver(replicas)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	obsDone, loadDone := obs.run(ctx), l.run(ctx)
	meter := &load.Meter{Pids: map[string]int{}}
	for i, m := range replicas {
		meter.Pids[fmt.Sprintf("replica %d", i)] = m.Pid()
	}
	phases := soakPhases(d)
	for _, p := range phases {
		runSoakPhase(t, p, soakAttacker{bin: attackBin, kinds: kinds, nice: nice}, replicas, l, obs, meter)
	}
	cancel()
	<-loadDone
	<-obsDone
	harness.Report(t, "the attacker ran at nice %d (%s; 0: the replicas' own priority)", nice, soakNiceEnv)
	reportSoak(t, phases, obs, replicas)
	checkSoak(t, phases, obs)
}

// startSoakReplicas starts two replicas on one CA state Secret, each
// with its own gRPC and admin port, and returns them and the CA's roots.
func startSoakReplicas(t *testing.T, system string) ([]*harness.Meshca, *x509.CertPool) {
	t.Helper()
	args := []string{"--state-secret", system + "/meshca-ca", "--kubeconfig", cluster.Kubeconfig,
		"--trust-lease-namespace", system, "--trusted-node-accounts", system + "/ztunnel",
		"--node-proxy-deny", "kube-system," + system + "/istiod",
		// As the chart runs it: its memory limit sets the Go runtime's
		// soft limit.
		fmt.Sprintf("--memory-limit=%d", chartMemoryLimit)}
	if os.Getenv(soakPprofEnv) != "" {
		args = append(args, "--enable-pprof")
	}
	replicas := make([]*harness.Meshca, 2)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			m, err := harness.StartMeshcaProcess(bin, args...)
			if err != nil {
				t.Error(err)
				return
			}
			replicas[i] = m
			t.Cleanup(func() {
				m.Stop()
				if t.Failed() {
					t.Logf("replica %d log (last 8 KiB):\n%s", i, tail(m.Logs(), 8<<10))
				}
			})
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	st, _, err := (&secretstore.Store{Client: cluster.Client, Namespace: system, Name: "meshca-ca"}).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return replicas, certs.Pool(st.Bundle()...)
}

// soakProfiles writes m's CPU profile over 30 s, from 5 s into the
// phase, and then its heap profile, to dir.
func soakProfiles(t *testing.T, m *harness.Meshca, dir, phase string) {
	time.Sleep(5 * time.Second)
	for _, kind := range []string{"profile", "heap"} {
		r, err := http.Get("http://" + m.AdminAddr + "/debug/pprof/" + kind + "?seconds=30")
		if err != nil {
			t.Logf("%s: %v", soakPprofEnv, err)
			return
		}
		b, err := io.ReadAll(r.Body)
		r.Body.Close()
		name := filepath.Join(dir, strings.ReplaceAll(phase, " ", "-")+"."+kind+".pprof")
		if err == nil {
			err = os.WriteFile(name, b, 0o644)
		}
		if err != nil {
			t.Logf("%s: %v", soakPprofEnv, err)
		}
	}
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// runSoakPhase runs one phase: the attack, if the phase has one, for
// its duration or until the observer says to stop, and collects what
// the phase measured.
func runSoakPhase(t *testing.T, p *soakPhase, attacker soakAttacker, replicas []*harness.Meshca, l *soakLoad, obs *soakObserver, meter *load.Meter) {
	t.Helper()
	t.Logf("%s for %v", p.name, p.d)
	start, cpu0 := time.Now(), meter.Read()
	var a *soakAttack
	if p.sources > 0 {
		a = attacker.start(t, replicas, p.from, p.sources)
		if dir := os.Getenv(soakPprofEnv); dir != "" {
			go soakProfiles(t, replicas[0], dir, p.name)
		}
	}
	for time.Since(start) < p.d {
		if p.aborted = obs.aborted(); p.aborted != "" {
			break
		}
		if a != nil {
			if err := a.exited(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	p.took = time.Since(start)
	if a != nil {
		stopping := time.Now()
		p.attack, p.attackCPU = a.stop()
		p.stopTook = time.Since(stopping)
	}
	p.cpu = meter.Read()
	for k, v := range cpu0 {
		p.cpu[k] -= v
	}
	p.lat, p.seen = l.begin(), obs.begin()
}

// reportSoak sends every phase's figures to harness.Report.
func reportSoak(t *testing.T, phases []*soakPhase, obs *soakObserver, replicas []*harness.Meshca) {
	t.Helper()
	for i, p := range phases {
		s := p.seen
		s.mu.Lock()
		line := fmt.Sprintf("%d %s (%v): legitimate requests %s; /readyz probes %d, %d failed%s; scrapes %d, %d failed%s; "+
			"replicas: RSS max %s MiB, go_goroutines max %v, meshca_connections_open max %v; CPU: %s",
			i+1, p.name, p.took.Round(time.Millisecond), p.lat, s.probes, s.probesFailed, because(s.probeErr), s.scrapes, s.scrapesFailed,
			because(s.scrapeErr), mibs(s.rss), s.goroutines, s.connsOpen, soakCPU(p))
		s.mu.Unlock()
		if p.sources > 0 {
			line += fmt.Sprintf("; the attacker closed everything in %v", p.stopTook.Round(time.Millisecond))
		}
		if p.aborted != "" {
			line += "; stopped early: " + p.aborted
		}
		harness.Report(t, "%s", line)
		for _, k := range soakAttackSummary(p.attack) {
			harness.Report(t, "%d %s: %s", i+1, p.name, k)
		}
	}
	var hwm []int64
	for _, m := range replicas {
		v, _ := statusKB(m.Pid(), "VmHWM")
		hwm = append(hwm, v)
	}
	var rss []int64
	for i := range obs.rssMax {
		rss = append(rss, obs.rssMax[i].Load())
	}
	base := phases[0].lat.pct("", 0.99)
	var ratios []string
	for _, p := range phases {
		if p.sources > 0 {
			ratios = append(ratios, fmt.Sprintf("%.2f (%s)", float64(p.lat.pct("", 0.99))/float64(base), p.name))
		}
	}
	harness.Report(t, "summary: p99 under attack over the baseline's %s, at most %d allowed; RSS max by replica %s MiB (VmHWM %s MiB), under %d MiB allowed",
		strings.Join(ratios, ", "), soakP99Factor, mibs(rss), mibs(hwm), soakMaxRSS>>20)
}

func because(err string) string {
	if err == "" {
		return ""
	}
	return " (last: " + err + ")"
}

func mibs(v []int64) string {
	var s []string
	for _, b := range v {
		s = append(s, fmt.Sprint(b>>20))
	}
	return strings.Join(s, "/")
}

// soakCPU is the CPU each process used in p: the replicas, this test
// process (the load generator, and the observer), the attacker.
func soakCPU(p *soakPhase) string {
	var s []string
	for _, name := range []string{"replica 0", "replica 1"} {
		s = append(s, fmt.Sprintf("%s %v", name, p.cpu[name].Round(10*time.Millisecond)))
	}
	self := p.cpu[load.Self]
	per := ""
	if n := p.lat.served(""); n > 0 {
		per = fmt.Sprintf(", %v a request", (self / time.Duration(n)).Round(time.Microsecond))
	}
	s = append(s, fmt.Sprintf("load generator %v%s", self.Round(10*time.Millisecond), per))
	if p.sources > 0 {
		s = append(s, fmt.Sprintf("attacker %v", p.attackCPU.Round(10*time.Millisecond)))
	}
	return strings.Join(s, ", ")
}

// checkSoak asserts the pass criteria.
func checkSoak(t *testing.T, phases []*soakPhase, obs *soakObserver) {
	t.Helper()
	base := phases[0].lat.pct("", 0.99)
	for _, p := range phases {
		if failed, why := p.lat.failures(); failed > 0 {
			t.Errorf("%s: %d legitimate requests failed: %s", p.name, failed, why)
		}
		if p.seen.probesFailed > 0 {
			t.Errorf("%s: %d of %d readiness probes failed (last: %s)", p.name, p.seen.probesFailed, p.seen.probes, p.seen.probeErr)
		}
		if p.aborted != "" {
			t.Errorf("%s stopped after %v: %s", p.name, p.took.Round(time.Millisecond), p.aborted)
		}
		if p99 := p.lat.pct("", 0.99); p.sources > 0 && p99 > soakP99Factor*base {
			missed(t, "%s: p99 %v, more than %d× the baseline's %v", p.name, p99, soakP99Factor, base)
		}
	}
	for i := range obs.rssMax {
		if rss := obs.rssMax[i].Load(); rss >= soakMaxRSS {
			missed(t, "replica %d: RSS reached %d MiB, the soak allows less than %d MiB", i, rss>>20, soakMaxRSS>>20)
		}
	}
}

// missed is a target the soak did not meet: an error under `make soak`
// (soakStrictEnv), a reported figure in `make test`.
func missed(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv(soakStrictEnv) != "" {
		t.Errorf(format, args...)
		return
	}
	harness.Report(t, "soak target not met (asserted by make soak): "+format, args...)
}

// Command loadgen measures `meshca serve` under load the way ztunnel loads
// it, against a real etcd and kube-apiserver: ztunnel's bound token on
// every request, the identities of the workloads on its node asked for by
// ImpersonatedIdentity, P-256 CSRs built before anything is measured.
//
// In one run it measures this machine's raw limit for one issuance (parse
// and verify a CSR, sign a P-256 leaf, on GOMAXPROCS goroutines: the cores
// meshca has) and prints every figure as a fraction of it, since absolute
// figures on a shared machine are noise:
//
//   - sustained load at each number of concurrent streams over each number
//     of connections, the TokenReview cached: requests/s, p50, p99, the
//     fraction of the raw limit, and the CPU meshca and this client spent
//     per request against the raw work's;
//   - a node-restart burst: every node's ztunnel, with a new token (the
//     TokenReview cache has never seen it) and a new connection, asks for
//     all of its workloads' certificates at once;
//   - with -profile, meshca's CPU and allocation profiles (it runs with
//     --enable-pprof) and this client's CPU profile under load, and their
//     top entries.
//
// make bench-load runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/load"
	"github.com/meshca/meshca/internal/benchbase"
	"github.com/meshca/meshca/keymgr/certs"
)

type options struct {
	streams, conns []int
	rounds         int
	warmup, d, raw time.Duration
	nodes, perNode int
	bursts         int
	profile        string
	profileStreams int
	profileConns   int
	profileFor     time.Duration
	meshcaArgs     []string
	bin            string
}

func main() {
	var o options
	streams := flag.String("streams", "1,8,64,256", "concurrent streams (requests in flight) to measure, comma-separated")
	conns := flag.String("conns", "1,4", "connections to spread the streams over, comma-separated")
	flag.IntVar(&o.rounds, "rounds", 2, "measurements of each load level, in turn with the others; the best counts")
	flag.DurationVar(&o.d, "duration", 2*time.Second, "measured time of each load level, and of the steady load after each burst")
	flag.DurationVar(&o.warmup, "warmup", 300*time.Millisecond, "load before each measurement that is not counted")
	flag.DurationVar(&o.raw, "raw", 600*time.Millisecond, "time the raw limit is measured for before each load level")
	flag.IntVar(&o.nodes, "nodes", 10, "nodes of the burst, each with a ztunnel; node-0's workloads also take the sustained load")
	flag.IntVar(&o.perNode, "pods-per-node", 110, "workload Pods on each node")
	flag.IntVar(&o.bursts, "bursts", 3, "node-restart bursts (0: none)")
	flag.StringVar(&o.profile, "profile", "", "directory for CPU and allocation profiles of meshca and of this client under load (empty: none)")
	flag.IntVar(&o.profileStreams, "profile-streams", 64, "streams of the profiled load")
	flag.IntVar(&o.profileConns, "profile-conns", 4, "connections of the profiled load")
	flag.DurationVar(&o.profileFor, "profile-duration", 8*time.Second, "how long the profiled load runs")
	extra := flag.String("meshca-args", "", "more flags for meshca serve, space-separated")
	flag.StringVar(&o.bin, "meshca", "", "meshca binary to measure (empty: build this tree's)")
	flag.Parse()
	var err error
	if o.streams, err = ints(*streams); err == nil {
		o.conns, err = ints(*conns)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	o.meshcaArgs = strings.Fields(*extra)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: want positive integers, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "meshca-loadgen-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := o.bin
	if bin == "" {
		if bin, err = harness.BuildMeshca(dir); err != nil {
			return err
		}
	}
	help := load.ServeHelp(bin)
	cluster, err := harness.StartCluster(ctx, filepath.Join(dir, "k8s"))
	if err != nil {
		return err
	}
	defer cluster.Stop()
	setup := time.Now()
	nodes, err := makeNodes(ctx, cluster.Client, o.nodes, o.perNode)
	if err != nil {
		return err
	}
	state := filepath.Join(dir, "state")
	start := func(extra ...string) (*harness.Meshca, error) {
		args := append([]string{"--state-dir", state, "--kubeconfig", cluster.Kubeconfig,
			"--trusted-node-accounts", systemNS + "/" + ztunnel, "--audit-log-file", filepath.Join(dir, "audit.log")}, extra...)
		return harness.StartMeshcaProcess(bin, append(args, o.meshcaArgs...)...)
	}
	// The sustained load measures what a request costs, not the budget of
	// one ztunnel (--node-proxy-rate, --node-proxy-max-in-flight): the
	// budgets are off.
	unlimited := load.Unlimited(bin)
	if o.profile != "" {
		if !load.HasFlag(help, "enable-pprof") {
			return errors.New("-profile: this meshca has no --enable-pprof")
		}
		unlimited = append(unlimited, "--enable-pprof")
	}
	m, err := start(unlimited...)
	if err != nil {
		return err
	}
	defer func() { m.Stop() }()
	roots, _, err := harness.RootBundle(ctx, bin, "--state-dir", state)
	if err != nil {
		return err
	}
	t := load.Target{Addr: m.Addr, Roots: certs.Pool(roots...)}
	reqs, pems, err := load.Requests(nodes[0].ids, 2, true)
	if err != nil {
		return err
	}
	fmt.Printf("setup: %d nodes x %d Pods, meshca ready, %d CSRs built in %v\n", o.nodes, o.perNode, len(reqs), time.Since(setup).Round(time.Millisecond))
	printMachine()
	raw := benchbase.NewRawIssuance(pems)
	var rep report
	meter := &load.Meter{Pids: map[string]int{"meshca": m.Pid()}}
	if err := rep.sustained(ctx, o, t, nodes[0].token, reqs, raw, meter); err != nil {
		return err
	}
	if o.profile != "" {
		if err := profileLoad(o, t, nodes[0].token, reqs, m.AdminAddr, rep.raw); err != nil {
			return err
		}
	}
	if err := logErrors(m); err != nil {
		return err
	}
	if o.bursts > 0 {
		// The bursts run with the default budgets, but for the rate of one
		// node proxy (--node-proxy-rate, 200/s): the steady load each burst
		// is held to is the CA's capacity, above what a ztunnel may
		// sustain. A burst (110 at once) is within a ztunnel's default
		// burst (--node-proxy-burst, 1000) and in-flight (256) budgets.
		var burstArgs []string
		if load.HasFlag(string(help), "node-proxy-rate") {
			burstArgs = append(burstArgs, "--node-proxy-rate=0")
		}
		// Every node's ztunnel connects from 127.0.0.1: 1,100 requests
		// from one address before their new tokens are reviewed.
		if load.HasFlag(string(help), "max-unauthenticated-streams-per-peer") {
			burstArgs = append(burstArgs, "--max-unauthenticated-streams-per-peer=0")
		}
		if o.profile != "" {
			burstArgs = append(burstArgs, "--enable-pprof")
		}
		m.Stop()
		if m, err = start(burstArgs...); err != nil {
			return err
		}
		t.Addr = m.Addr
		if err := rep.burst(ctx, o, t, cluster, nodes, m.AdminAddr, &load.Meter{Pids: map[string]int{"meshca": m.Pid()}}); err != nil {
			return err
		}
		if err := logErrors(m); err != nil {
			return err
		}
		if err := rep.compareProfiles(); err != nil {
			return err
		}
	}
	rep.summary()
	return rep.err
}

// logErrors fails when meshca logged an error.
func logErrors(m *harness.Meshca) error {
	if out := m.Logs(); strings.Contains(out, `"level":"ERROR"`) {
		return errors.New("meshca logged errors:\n" + out)
	}
	return nil
}

func printMachine() {
	model := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	fmt.Printf("machine: %d CPUs (%s), GOMAXPROCS %d here and in meshca, %s; load average %s\n",
		runtime.NumCPU(), model, runtime.GOMAXPROCS(0), runtime.Version(), load.LoadAvg())
}

// parallel runs f(0..n-1) on 16 goroutines and returns the first error.
func parallel(n int, f func(i int) error) error {
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

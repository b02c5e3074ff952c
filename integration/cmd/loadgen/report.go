package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/meshca/meshca/integration/load"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
)

// Goals of issue 11.
const (
	goalFraction = 0.60            // of the raw limit, at the best load level
	goalBurstMax = 2 * time.Second // the slowest request of a burst
	goalBurst    = 0.8             // burst throughput over steady throughput
)

// report collects the figures of one run for the summary.
type report struct {
	err     error
	raw     load.Raw
	best    cell // by x-raw
	bestCPU cell // by x-raw cpu
	bursts  []burstRound
	// With -profile: meshca's CPU profiles of the bursts and of the steady
	// loads after them, the requests the bursts served and the steady
	// loads' rates.
	burstProfiles, steadyProfiles []string
	burstServed                   int
	steadyRate                    []float64
}

// cell is one load level: the best of its rounds.
type cell struct {
	streams, conns int
	// rate is the best round's req/s, with its p50 and p99.
	rate     float64
	p50, p99 time.Duration
	// meshca and client are the least CPU per request of the rounds.
	meshca, client time.Duration
	errs           int
	firstErr       error
}

func (c *cell) add(s *load.Sample) {
	if s.Rate() > c.rate {
		c.rate, c.p50, c.p99 = s.Rate(), s.Pct(0.5), s.Pct(0.99)
	}
	least := func(cur *time.Duration, v time.Duration) {
		if v > 0 && (*cur == 0 || v < *cur) {
			*cur = v
		}
	}
	least(&c.meshca, s.CPUPerReq("meshca"))
	least(&c.client, s.CPUPerReq(load.Self))
	c.errs += s.Errs
	if c.firstErr == nil {
		c.firstErr = s.FirstErr
	}
}

// fractions are x-raw, x-raw cpu, and meshca's and the client's CPU per
// request over the raw work's.
func (c *cell) fractions(raw load.Raw) (wall, byCPU, meshca, client float64) {
	meshca, client = float64(c.meshca)/float64(raw.CPU), float64(c.client)/float64(raw.CPU)
	if meshca+client > 0 {
		byCPU = 1 / (meshca + client)
	}
	return c.rate / raw.Rate, byCPU, meshca, client
}

func (r *report) fail(format string, args ...any) {
	err := fmt.Errorf(format, args...)
	fmt.Println("FAIL:", err)
	r.err = errors.Join(r.err, err)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// sustained measures every load level o.rounds times, the levels in turn,
// each right after a measurement of the raw limit.
func (r *report) sustained(ctx context.Context, o options, t load.Target, token string, reqs []*authpb.IstioCertificateRequest, raw func(), m *load.Meter) error {
	workers := runtime.GOMAXPROCS(0)
	fmt.Printf("\nsustained load, TokenReview cached: one ztunnel token, %d workload identities of its node, %d CSRs in turn;\n", len(reqs)/2, len(reqs))
	fmt.Printf("%d rounds of every level, %v each after %v of warm-up; raw limit measured for %v before each\n", o.rounds, o.d, o.warmup, o.raw)
	var cells []*cell
	for _, nc := range o.conns {
		for _, ns := range o.streams {
			cells = append(cells, &cell{streams: ns, conns: nc})
		}
	}
	var raws []load.Raw
	for round := 1; round <= o.rounds; round++ {
		fmt.Printf("round %d (load average %s):", round, load.LoadAvg())
		for _, c := range cells {
			if err := ctx.Err(); err != nil {
				return err
			}
			raws = append(raws, load.RawLimit(raw, workers, o.raw))
			conns, err := t.DialN(c.conns, token, reqs[0])
			if err != nil {
				return err
			}
			s := load.Sustain(c.streams, func(stream, i int) error {
				return conns[stream%len(conns)].Call(reqs[i%len(reqs)])
			}, o.warmup, o.d, m)
			load.CloseAll(conns)
			c.add(s)
			fmt.Printf(" %d/%d %.0f/s", c.streams, c.conns, s.Rate())
		}
		fmt.Println()
	}
	r.raw = load.Best(raws)
	fmt.Printf("\nraw limit (parse+verify a P-256 CSR, sign a P-256 leaf, %d goroutines; best of %d): %.0f/s, %.0f µs CPU per op\n",
		workers, 3*len(raws), r.raw.Rate, float64(r.raw.CPU.Nanoseconds())/1000)
	fmt.Printf("x-raw: best req/s over the raw limit.  meshca, client: least CPU per request over the raw work's.\n")
	fmt.Printf("x-raw cpu: 1/(meshca+client): the x-raw this CPU cost gives when nothing else runs on the cores\n\n")
	fmt.Printf("%7s %5s | %8s %8s %8s | %6s | %7s %7s %9s\n", "streams", "conns", "req/s", "p50 ms", "p99 ms", "x-raw", "meshca", "client", "x-raw cpu")
	for _, c := range cells {
		wall, byCPU, meshca, client := c.fractions(r.raw)
		fmt.Printf("%7d %5d | %8.0f %8.2f %8.2f | %6.2f | %6.2fx %6.2fx %9.2f\n", c.streams, c.conns, c.rate, ms(c.p50), ms(c.p99),
			wall, meshca, client, byCPU)
		if c.errs > 0 {
			r.fail("%d streams over %d connections: %d requests failed, the first: %v", c.streams, c.conns, c.errs, c.firstErr)
		}
		if w, _, _, _ := r.best.fractions(r.raw); r.best.rate == 0 || wall > w {
			r.best = *c
		}
		if _, b, _, _ := r.bestCPU.fractions(r.raw); r.bestCPU.rate == 0 || byCPU > b {
			r.bestCPU = *c
		}
	}
	return nil
}

func (r *report) summary() {
	verdict := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "BELOW GOAL"
	}
	fmt.Printf("\nsummary (load average %s)\n", load.LoadAvg())
	if r.best.rate > 0 {
		wall, _, _, _ := r.best.fractions(r.raw)
		fmt.Printf("  best sustained: %d streams over %d connections, %.0f req/s = %.2f of the raw limit (goal >= %.2f: %s)\n",
			r.best.streams, r.best.conns, r.best.rate, wall, goalFraction, verdict(wall >= goalFraction))
		_, byCPU, meshca, _ := r.bestCPU.fractions(r.raw)
		fmt.Printf("  by CPU time: %d streams over %d connections, %.2f of the raw limit with this client on the same cores (goal >= %.2f: %s); meshca alone %.2f\n",
			r.bestCPU.streams, r.bestCPU.conns, byCPU, goalFraction, verdict(byCPU >= goalFraction), 1/max(meshca, 1e-9))
	}
	if len(r.bursts) > 0 {
		var slowest time.Duration
		var ratios, cpu []float64
		for _, b := range r.bursts {
			slowest = max(slowest, b.slowest)
			ratios, cpu = append(ratios, b.vsSteady), append(cpu, b.cpuVsSteady)
		}
		slices.Sort(ratios)
		slices.Sort(cpu)
		med := ratios[len(ratios)/2]
		fmt.Printf("  bursts: slowest request %.0f ms (goal <= %v: %s); throughput over steady: median %.2f (goal >= %.2f: %s), least %.2f;\n",
			ms(slowest), goalBurstMax, verdict(slowest <= goalBurstMax), med, goalBurst, verdict(med >= goalBurst), ratios[0])
		fmt.Printf("          meshca's CPU per request in a burst over steady's: median %.2f, most %.2f\n", cpu[len(cpu)/2], cpu[len(cpu)-1])
	}
}

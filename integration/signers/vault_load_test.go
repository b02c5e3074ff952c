package signers

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// issued is what a steady stream of certificate requests met.
type issued struct {
	mu        sync.Mutex
	oks       []time.Time // when each success was answered
	failures  []failure   // in order
	latencies []time.Duration
	// lastOK is when the last request that succeeded was answered, and
	// maxGap the longest time between two answered successes.
	lastOK time.Time
	maxGap time.Duration
}

// issueSteadily asks c for id's certificate every interval (or as soon
// as the last answer came, when that took longer), each with a fresh key,
// until ctx ends; every reply is checked (the chain, its lint, the key).
func issueSteadily(ctx context.Context, t *testing.T, c *checked.Client, id spiffeid.ID, interval time.Duration) *issued {
	out := &issued{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Error(err)
			return out
		}
		csrPEM, err := csr.Build(key, id)
		if err != nil {
			t.Error(err)
			return out
		}
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		// The bare call, timed; the reply's checks after.
		chain, err := c.Client.Call(rctx, string(csrPEM), id, caclient.Options{})
		end := time.Now()
		cancel()
		if err == nil {
			_, err = checked.Check(t, chain, id, key)
		}
		out.record(start, end, err)
	}
}

// failure is a request that failed: when it was sent and answered, and
// how.
type failure struct {
	start, end time.Time
	code       codes.Code
	err        string
}

func (s *issued) record(start, end time.Time, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latencies = append(s.latencies, end.Sub(start))
	if err != nil {
		s.failures = append(s.failures, failure{start: start, end: end, code: status.Code(err), err: err.Error()})
		return
	}
	if !s.lastOK.IsZero() {
		s.maxGap = max(s.maxGap, end.Sub(s.lastOK))
	}
	s.oks = append(s.oks, end)
	s.lastOK = end
}

// failed returns the failures so far.
func (s *issued) failed() []failure {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.failures)
}

// failureList describes the first n failures.
func (s *issued) failureList(n int) string {
	var out []string
	f := s.failed()
	for _, f := range f[:min(n, len(f))] {
		out = append(out, fmt.Sprintf("%s: %s", f.start.Format("15:04:05.000"), f.err))
	}
	return strings.Join(out, "; ")
}

// failureSpan says when the failures were sent, relative to at.
func (s *issued) failureSpan(at time.Time) string {
	f := s.failed()
	if len(f) == 0 {
		return "none"
	}
	byCode := map[codes.Code]int{}
	for _, x := range f {
		byCode[x.code]++
	}
	return fmt.Sprintf("sent from %v to %v after it (%v)", f[0].start.Sub(at).Round(time.Millisecond), f[len(f)-1].start.Sub(at).Round(time.Millisecond), byCode)
}

// firstOKAfter is when the first success answered after at was.
func (s *issued) firstOKAfter(at time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.oks {
		if t.After(at) {
			return t, true
		}
	}
	return time.Time{}, false
}

// String sums the stream up: counts, latency and the longest wait
// between two certificates.
func (s *issued) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := slices.Sorted(slices.Values(s.latencies))
	q := func(p float64) time.Duration {
		if len(l) == 0 {
			return 0
		}
		return l[min(len(l)-1, int(p*float64(len(l))))].Round(time.Millisecond)
	}
	return fmt.Sprintf("%d certificates issued, %d failed (latency p50 %v, p99 %v, max %v; longest between two issued %v)",
		len(s.oks), len(s.failures), q(0.5), q(0.99), q(1), s.maxGap.Round(time.Millisecond))
}

// loginGauges are meshca's own Vault login gauges (signer/vault/vaultprom)
// sampled from its /metrics: how often meshca said it held no token, the
// least token TTL it reported, and how often that TTL went up (a renewal
// or a login; two within one sample count once).
type loginGauges struct {
	samples, loggedOut, rises int
	minTTL, maxTTL, prevTTL   float64
	errors                    int
}

// sampleLogin scrapes meshca's admin port every interval until ctx ends.
func sampleLogin(ctx context.Context, adminAddr string, interval time.Duration) *loginGauges {
	g := &loginGauges{minTTL: math.Inf(1), prevTTL: math.NaN()}
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return g
		case <-tick.C:
		}
		in, ttl, err := scrapeLogin(client, adminAddr)
		if err != nil {
			g.errors++
			continue
		}
		g.samples++
		if in != 1 {
			g.loggedOut++
		}
		g.minTTL, g.maxTTL = min(g.minTTL, ttl), max(g.maxTTL, ttl)
		if ttl > g.prevTTL+0.5 { // it falls by the interval between samples otherwise
			g.rises++
		}
		g.prevTTL = ttl
	}
}

func (g *loginGauges) String() string {
	return fmt.Sprintf("%d samples of /metrics: meshca_vault_logged_in 0 in %d, meshca_vault_token_ttl_seconds from %.1f to %.1f, rising %d times",
		g.samples, g.loggedOut, g.minTTL, g.maxTTL, g.rises)
}

// scrapeLogin reads meshca_vault_logged_in and
// meshca_vault_token_ttl_seconds.
func scrapeLogin(client *http.Client, adminAddr string) (loggedIn, ttl float64, err error) {
	r, err := client.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer r.Body.Close()
	found := 0
	sc := bufio.NewScanner(r.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var dst *float64
		switch name {
		case "meshca_vault_logged_in":
			dst = &loggedIn
		case "meshca_vault_token_ttl_seconds":
			dst = &ttl
		default:
			continue
		}
		if *dst, err = strconv.ParseFloat(value, 64); err != nil {
			return 0, 0, err
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("/metrics of meshca lacks its Vault login gauges")
	}
	return loggedIn, ttl, sc.Err()
}

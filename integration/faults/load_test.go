package faults

import (
	"fmt"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/load"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// outcome is one request of the load: when it ran and what it got.
type outcome struct {
	start, end time.Time
	code       codes.Code
	msg        string
	reply      []string
}

func (o outcome) took() time.Duration { return o.end.Sub(o.start) }

func (o outcome) String() string {
	return fmt.Sprintf("%v after %v: %q", o.code, o.took().Round(time.Millisecond), o.msg)
}

// call makes one request on c and times it.
func call(c *load.Conn, req *authpb.IstioCertificateRequest) outcome {
	o := outcome{start: time.Now()}
	reply, err := c.Reply(req)
	o.end = time.Now()
	st := status.Convert(err)
	o.code, o.msg, o.reply = st.Code(), st.Message(), reply
	return o
}

// stream is load that runs until halted: goroutines each calling back to
// back, with a pause after every call, keeping every outcome.
type stream struct {
	name string
	mu   sync.Mutex
	out  []outcome
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// startStream runs n goroutines of calls; the i-th call of all is
// do(i). It halts at cleanup, before whatever the test started earlier
// (meshca, its dependencies) stops.
func startStream(t *testing.T, name string, n int, pause time.Duration, do func(i int) outcome) *stream {
	s := &stream{name: name, stop: make(chan struct{})}
	for g := range n {
		s.wg.Go(func() {
			for i := g; ; i += n {
				o := do(i)
				s.mu.Lock()
				s.out = append(s.out, o)
				s.mu.Unlock()
				select {
				case <-s.stop:
					return
				case <-time.After(pause):
				}
			}
		})
	}
	t.Cleanup(s.halt)
	return s
}

// halt stops the calls and waits for those in progress.
func (s *stream) halt() {
	s.once.Do(func() { close(s.stop) })
	s.wg.Wait()
}

// within returns the outcomes that started at or after from and ended
// by to; a zero time is no bound.
func (s *stream) within(from, to time.Time) []outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []outcome
	for _, o := range s.out {
		if !o.start.Before(from) && (to.IsZero() || !o.end.After(to)) {
			out = append(out, o)
		}
	}
	return out
}

// waitFor waits up to bound for an outcome that started at or after from
// and matches w, and returns it.
func (s *stream) waitFor(t *testing.T, from time.Time, w want, bound time.Duration) outcome {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		for _, o := range s.within(from, time.Time{}) {
			if w.matches(o) {
				return o
			}
		}
		if time.Now().After(deadline) {
			last := s.within(from, time.Time{})
			if len(last) > 0 {
				t.Fatalf("%s: no %v within %v of %v; last: %v", s.name, w, bound, from.Format(time.StampMilli), last[len(last)-1])
			}
			t.Fatalf("%s: no call completed within %v", s.name, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// want is an answer a window of the load allows: a gRPC code and the
// message meshca (or the client's transport) says with it.
type want struct {
	code codes.Code
	msg  *regexp.Regexp
}

func (w want) String() string { return fmt.Sprintf("%v %q", w.code, w.msg) }

func (w want) matches(o outcome) bool { return o.code == w.code && w.msg.MatchString(o.msg) }

// exactly is want with the exact message.
func exactly(code codes.Code, msg string) want {
	return want{code, regexp.MustCompile("^" + regexp.QuoteMeta(msg) + "$")}
}

// The answers of these tests: meshca's messages are its API (README, the
// table of codes), so they are matched exactly.
var (
	served        = exactly(codes.OK, "")
	reviewDown    = exactly(codes.Unavailable, "cannot review the token now, retry later")
	podsDown      = exactly(codes.Unavailable, "cannot check Pods now, retry later")
	notOnNode     = exactly(codes.PermissionDenied, "this caller may not request other identities")
	signerDown    = exactly(codes.Unavailable, "signing backend unavailable, retry later")
	signerRefused = exactly(codes.FailedPrecondition, "signing backend refused the request; the CA operator must check its configuration")
)

// check fails t for every outcome of outs that none of wants allows (the
// first few are shown), and returns how many matched each want.
func check(t *testing.T, what string, outs []outcome, wants ...want) []int {
	t.Helper()
	counts := make([]int, len(wants))
	var bad []outcome
	for _, o := range outs {
		i := slices.IndexFunc(wants, func(w want) bool { return w.matches(o) })
		if i < 0 {
			bad = append(bad, o)
			continue
		}
		counts[i]++
	}
	if len(bad) > 0 {
		t.Errorf("%s: %d of %d answers are none of %v, e.g. %v", what, len(bad), len(outs), wants, bad[:min(len(bad), 3)])
	}
	return counts
}

// count is how many of outs w allows.
func count(outs []outcome, w want) int {
	n := 0
	for _, o := range outs {
		if w.matches(o) {
			n++
		}
	}
	return n
}

// failFast fails t unless every failure of outs came within bound, and
// returns the p99 and the slowest of their latencies.
func failFast(t *testing.T, what string, outs []outcome, bound time.Duration) (p99, slowest time.Duration) {
	t.Helper()
	var lat []time.Duration
	for _, o := range outs {
		if o.code != codes.OK {
			lat = append(lat, o.took())
		}
	}
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	p99, slowest = lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]
	if slowest > bound {
		t.Errorf("%s: a failure took %v (p99 %v), past the bound %v", what, slowest, p99, bound)
	}
	return p99, slowest
}

package faults

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/load"
	"google.golang.org/grpc/codes"
)

// gracePeriod is how long meshca's graceful stop may take before it cuts
// the requests left (ca/serve.Parts.Run).
const gracePeriod = 10 * time.Second

// refused is a request a stopped server never saw: grpc-go's answer when
// meshca's listener is closed.
var refused = want{codes.Unavailable,
	regexp.MustCompile(`^connection error: desc = "transport: Error while dialing: dial tcp 127\.0\.0\.1:\d+: connect: connection refused"$`)}

// TestGracefulStop sends meshca SIGTERM under load while requests are in
// progress at the server, held there by an apiserver that does not answer
// their TokenReview (paused). The held requests are served once the
// apiserver answers, after the signal; requests the server has not taken
// are refused with Unavailable, never an error the client would not
// retry; meshca exits 0, within its grace period.
func TestGracefulStop(t *testing.T) {
	noLeaks(t)
	m := newMesh(t, 8)
	fresh := make([]string, 6)
	for i := range fresh {
		fresh[i] = m.freshToken(t)
	}
	// A request timeout well past the apiserver's pause: the held
	// requests must be served, not cut by their deadline.
	s := harness.StartSelfSigned(t, bin, cluster.Kubeconfig, m.args(5*time.Second)...)
	target := load.Target{Addr: s.Addr, Roots: s.Roots}
	zt := dial(t, target, m.token)
	workload := requests(t, m.ids, 4)
	if o := call(zt, workload[0]); !served.matches(o) {
		t.Fatalf("first request: %v", o)
	}
	bg := startStream(t, "reviewed token", 2, 10*time.Millisecond, func(i int) outcome { return call(zt, nth(workload, i)) })
	time.Sleep(500 * time.Millisecond)

	resume, err := cluster.PauseAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resume() }) // whatever happens: the cluster serves the other tests
	reviews := tokenReviews(t, s.AdminAddr)
	held := make(chan outcome, len(fresh))
	for i, tok := range fresh {
		go func() { held <- call(zt.WithToken(tok), nth(workload, i)) }()
	}
	// They are in progress at meshca once it has counted their reviews.
	for deadline := time.Now().Add(10 * time.Second); tokenReviews(t, s.AdminAddr) < reviews+len(fresh); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("meshca did not start the TokenReviews of %d new tokens", len(fresh))
		}
	}
	select {
	case o := <-held:
		t.Fatalf("a request needing the paused apiserver was answered: %v", o)
	default:
	}

	term := time.Now()
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	late := call(dial(t, target, m.token), workload[1]) // a new client
	resumed := time.Now()
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	for range fresh {
		o := <-held
		if !served.matches(o) {
			t.Errorf("request in progress at SIGTERM: %v, want it served", o)
		} else {
			harness.CheckReply(t, o.reply)
		}
		if o.end.Before(resumed) {
			t.Errorf("request in progress at SIGTERM answered before the apiserver was resumed: %v", o)
		}
	}
	if !refused.matches(late) {
		t.Errorf("new client after SIGTERM: %v, want %v", late, refused)
	}

	for s.Exited() == nil && time.Since(term) < gracePeriod+margin {
		time.Sleep(10 * time.Millisecond)
	}
	exited := time.Now()
	st := s.Exited()
	if st == nil {
		t.Fatalf("meshca still runs %v after SIGTERM, past its grace period of %v", exited.Sub(term), gracePeriod)
	}
	if st.ExitCode() != 0 {
		t.Errorf("meshca exited with %v after SIGTERM, want 0", st)
	}
	harness.Report(t, "meshca exited %v after SIGTERM, %v after the held requests could finish", exited.Sub(term).Round(time.Millisecond),
		exited.Sub(resumed).Round(time.Millisecond))
	time.Sleep(200 * time.Millisecond)
	bg.halt()

	for _, w := range []struct {
		when     string
		from, to time.Time
		wants    []want
	}{
		{"before SIGTERM", time.Time{}, term, []want{served}},
		{"from SIGTERM to exit", term, exited, []want{served, refused}},
		{"after exit", exited, time.Time{}, []want{refused}},
	} {
		outs := bg.within(w.from, w.to)
		counts := check(t, bg.name+", "+w.when, outs, w.wants...)
		p99, slowest := failFast(t, bg.name+", "+w.when, outs, margin)
		t.Logf("%s, %s: %d answers, %v of %v; failures p99 %v, slowest %v", bg.name, w.when, len(outs), counts, w.wants,
			p99.Round(time.Millisecond), slowest.Round(time.Millisecond))
	}
	if n := len(bg.within(exited, time.Time{})); n == 0 {
		t.Error("no request was made after meshca exited")
	}
}

var reviewsSample = regexp.MustCompile(`(?m)^meshca_tokenreview_cache_misses_total\{cluster="Kubernetes"\} (\d+)$`)

// tokenReviews is how many token authentications of meshca at adminAddr
// have needed a TokenReview (a request is counted as it starts one).
func tokenReviews(t *testing.T, adminAddr string) int {
	t.Helper()
	r, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := reviewsSample.FindSubmatch(b)
	if m == nil {
		t.Fatalf("/metrics of meshca has no sample %s", reviewsSample)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

package istioclient

// istiod's certificate between the checkpoints: probers that open a fresh
// TLS connection to istiod several times a second, all through the mesh
// test, and verify its certificate as its clients would at that moment:
// on the xDS port (its Service) as istio-agent does (ISTIOD_SAN, the
// root-cert.pem the workload has mounted), on the webhook port as the
// apiserver does (the Service's name, each configuration's caBundle). The
// phase checks look at istiod only at their end, held xDS streams never
// handshake again, and the apiserver keeps its connections to a webhook:
// a break that heals before the next check is seen only here.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
)

// probeEvery is the prober's pace: the issue asks for a probe every second
// or faster.
const probeEvery = 250 * time.Millisecond

// probeOutcome sorts a probe's result.
type probeOutcome int

const (
	probeOK probeOutcome = iota
	// probeUnreachable: no TLS server answered. The dial failed, or the
	// Service closed the connection before any certificate arrived (it
	// had no ready Pod to forward to): istiod restarting, not its
	// certificate.
	probeUnreachable
	// probeUnverified: istiod presented a certificate that does not
	// verify against the roots or does not carry the name.
	probeUnverified
	// probeFailed: any other failure (a handshake alert, a timeout, roots
	// that cannot be read).
	probeFailed
)

func (o probeOutcome) String() string {
	return [...]string{"ok", "unreachable", "unverified", "failed"}[o]
}

// probeResult is one probe.
type probeResult struct {
	at      time.Time
	outcome probeOutcome
	err     error
}

// probeTally is the results of a series of probes.
type probeTally struct {
	mu      sync.Mutex
	results []probeResult
}

func (t *probeTally) add(r probeResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.results = append(t.results, r)
}

func (t *probeTally) all() []probeResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]probeResult(nil), t.results...)
}

// count is how many results had outcome o.
func (t *probeTally) count(o probeOutcome) int {
	n := 0
	for _, r := range t.all() {
		if r.outcome == o {
			n++
		}
	}
	return n
}

// probeTarget is one port of istiod's and what its certificate must
// verify against: the name san, and a root of what roots returns at that
// moment.
type probeTarget struct {
	name      string // what the roots are, for the figures
	addr, san string
	roots     func() ([]*x509.Certificate, error)
}

// mountedRoots are the roots of a PEM file, as mounted now.
func mountedRoots(path string) func() ([]*x509.Certificate, error) {
	return func() ([]*x509.Certificate, error) {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return pemutil.ParseCertificates(raw)
	}
}

// fixedRoots are roots, whatever the moment.
func fixedRoots(roots ...*x509.Certificate) func() ([]*x509.Certificate, error) {
	return func() ([]*x509.Certificate, error) { return roots, nil }
}

// probe opens one fresh TLS connection to the target, as a client of
// istiod does (istio-agent's xDS client presents its certificate too;
// istiod asks for one only if given, so the handshake is the server's side
// alone), and closes it once the handshake is done.
func (p probeTarget) probe() probeResult {
	at := time.Now()
	roots, err := p.roots()
	if err != nil || len(roots) == 0 {
		return probeResult{at: at, outcome: probeFailed, err: fmt.Errorf("%s: %d roots, %v", p.name, len(roots), err)}
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", p.addr, &tls.Config{
		RootCAs: certs.Pool(roots...), ServerName: p.san, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return probeResult{at: at, outcome: classify(err), err: fmt.Errorf("%s: %w", p.name, err)}
	}
	conn.Close()
	return probeResult{at: at, outcome: probeOK}
}

// classify sorts a TLS dial's error.
func classify(err error) probeOutcome {
	var verr *tls.CertificateVerificationError
	var oerr *net.OpError
	switch {
	case err == nil:
		return probeOK
	case errors.As(err, &verr):
		return probeUnverified
	case errors.As(err, &oerr) && oerr.Op == "dial",
		// The Service accepted, had no Pod to forward to, and closed.
		errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		return probeUnreachable
	}
	return probeFailed
}

// istiodProber probes its targets, one after the other, every probeEvery
// until stopped.
type istiodProber struct {
	targets []probeTarget
	tally   probeTally
	cancel  context.CancelFunc
	done    chan struct{}
	started time.Time
	stopped time.Time
}

func startProber(targets ...probeTarget) *istiodProber {
	ctx, cancel := context.WithCancel(context.Background())
	p := &istiodProber{targets: targets, cancel: cancel, done: make(chan struct{}), started: time.Now()}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(probeEvery)
		defer tick.Stop()
		for {
			for _, t := range p.targets {
				p.tally.add(t.probe())
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// stop ends the probes; it may be called more than once.
func (p *istiodProber) stop() {
	p.cancel()
	<-p.done
	if p.stopped.IsZero() {
		p.stopped = time.Now()
	}
}

// longestGap is the longest time between two probes of a target.
func (p *istiodProber) longestGap() time.Duration {
	var gap time.Duration
	results, n := p.tally.all(), len(p.targets)
	for i := n; i < len(results); i++ {
		gap = max(gap, results[i].at.Sub(results[i-n].at))
	}
	return gap
}

// judge lists what the probes must not show: a failure other than
// unreachable, an unreachable one outside every window in which istiod's
// Pod was replaced, a gap longer than a second, or an event (a Secret
// rewrite, a rollout) outside the probed span.
func (p *istiodProber) judge(rollouts []rollout, rewrites []time.Time) []string {
	var bad []string
	results := p.tally.all()
	for _, r := range results {
		switch {
		case r.outcome == probeUnverified || r.outcome == probeFailed:
			bad = append(bad, fmt.Sprintf("%s at %s: %v", r.outcome, r.at.Format("15:04:05.000"), r.err))
		case r.outcome == probeUnreachable && !inRestart(r.at, rollouts):
			bad = append(bad, fmt.Sprintf("unreachable outside an istiod restart at %s: %v", r.at.Format("15:04:05.000"), r.err))
		}
	}
	if gap := p.longestGap(); gap > time.Second {
		bad = append(bad, fmt.Sprintf("%v between two probes, want at most 1s", gap.Round(time.Millisecond)))
	}
	events := append([]time.Time(nil), rewrites...)
	for _, r := range rollouts {
		if r.replaced {
			events = append(events, r.stopping, r.ended)
		}
	}
	for _, e := range events {
		if len(results) == 0 || e.Before(results[0].at) || e.After(results[len(results)-1].at) {
			bad = append(bad, fmt.Sprintf("an istiod restart or Secret rewrite at %s was not probed", e.Format("15:04:05.000")))
		}
	}
	return bad
}

// restartSlack is how long after the old Pod exited a connection made
// before it may still fail: the time the Service takes to close it.
const restartSlack = time.Second

// inRestart says whether at falls in a rollout that replaced a running
// Pod, from when the old Pod was told to stop until restartSlack after it
// was gone: the one window in which istiod's Service may forward a new
// connection to a Pod that is going away.
func inRestart(at time.Time, rollouts []rollout) bool {
	for _, r := range rollouts {
		if r.replaced && !at.Before(r.stopping) && at.Before(r.ended.Add(restartSlack)) {
			return true
		}
	}
	return false
}

// restartWindows describes the windows inRestart allows.
func restartWindows(rollouts []rollout) string {
	var parts []string
	for _, r := range rollouts {
		if r.replaced {
			parts = append(parts, r.ended.Add(restartSlack).Sub(r.stopping).Round(10*time.Millisecond).String())
		}
	}
	return strings.Join(parts, " and ")
}

// probeControl runs n probes of target with each wrong expectation a
// client could hold (a root that never signed for the mesh, another name,
// a root the rotations retired) and n with the right one, at the same
// moment as the prober's: the wrong ones must count as unverified, the
// right ones as ok, or 0 failures would prove nothing.
func probeControl(target probeTarget, foreign, retired *x509.Certificate, n int) (summary string, bad []string) {
	wrongName := target
	wrongName.name, wrongName.san = "another name", "istiod.elsewhere.svc"
	cases := []struct {
		target probeTarget
		want   probeOutcome
	}{
		{probeTarget{name: "a foreign root", addr: target.addr, san: target.san, roots: fixedRoots(foreign)}, probeUnverified},
		{wrongName, probeUnverified},
		{probeTarget{name: "the retired first root", addr: target.addr, san: target.san, roots: fixedRoots(retired)}, probeUnverified},
		{target, probeOK},
	}
	var parts []string
	for _, c := range cases {
		var tally probeTally
		for range n {
			tally.add(c.target.probe())
		}
		got := tally.count(c.want)
		parts = append(parts, fmt.Sprintf("%s %d/%d %s", c.target.name, got, n, c.want))
		if got != n {
			r := tally.all()[0]
			bad = append(bad, fmt.Sprintf("control: probes verifying with %s: %d of %d %s, want all (first: %s: %v)", c.target.name, got, n, c.want, r.outcome, r.err))
		}
	}
	return strings.Join(parts, ", "), bad
}

package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/signer"
)

// Readiness (/readyz, and the gRPC health service that follows it) checks:
//
//   - pod-cache: the local cluster's Pod informer has had its first list.
//     Once it has, a list/watch that fails later is shown on the ok line
//     and logged (apiWatch), but does not take the replica out: the cache
//     it has still answers, and its misses fail as Unavailable on their own.
//   - ca-state: a CA state is in service and its active authority is valid
//     now (not before its NotBefore, not past its path's expiry). Absent
//     with pinned trust anchors, which have no state.
//   - signer: an external backend (Vault, remote cfssl, k8scsr) works: its
//     last answer, login or probe succeeded (backendHealth). It fails at
//     once while the backend has never worked since start, so that a
//     replica configured wrongly never takes traffic, but a backend that
//     worked and then fails is tolerated for backendGrace: shorter
//     failures (a Vault token re-login, a cfssl restart) do not take every
//     replica out at once. An outage longer than that does, deliberately:
//     no replica could sign anyway. The in-process backends (the built-in
//     CA, local cfssl) have no such check.
//   - istiod-cert (with --istiod-cert-secret): never fails. On the replica
//     that keeps istiod's certificate, a Secret of another owner, which
//     the keeper refuses to write (istiodcert.RefusedError), shows on its
//     ok line, naming the owner: workloads' certificates do not depend on
//     it, and taking the replica out would only move the keeper.
//   - serving-cert: the certificate new TLS handshakes on the gRPC port
//     get has not expired. Ready still, it says when less than a sixth
//     of its lifetime is left (servingExpiryWarning), and when the
//     operator's files (--serving-cert-file) hold a pair that was
//     refused, the last good one serving.
//   - upstream: with --upstream, the intermediate in service and its
//     renewals (upstreamCheck): it fails once the intermediate is too
//     close to its end to issue a certificate worth having, and names,
//     on its ok line, the upstream failing and the intermediate's end,
//     or an end less than a quarter of its life away.

const (
	// warnEvery is how often a failing apiserver is logged at most.
	warnEvery = time.Minute
	// apiCheckEvery is how often apiWatch looks at the informer and,
	// while the apiserver fails, probes it to see it recover.
	apiCheckEvery = 10 * time.Second
	// syncGrace is how long the informer may take for its first list
	// before that is logged.
	syncGrace = 10 * time.Second
	// probeTimeout bounds one probe of a dependency.
	probeTimeout = 5 * time.Second
	// backendGrace is how long a backend that has worked may fail before
	// readiness does.
	backendGrace = 30 * time.Second
	// backendProbeEvery is how often an external backend is probed when
	// nothing else has told how it is.
	backendProbeEvery = 10 * time.Second
)

// apiWatch follows whether the local apiserver feeds the Pod informer: it
// hears the informer's list and watch errors (in place of client-go's own
// log lines, one per retry), logs them at warn at most once every
// warnEvery while they last and at info when a probe sees the apiserver
// answer again, and tells readiness.
type apiWatch struct {
	cluster string
	log     *slog.Logger
	now     func() time.Time
	synced  func() bool
	// probe asks the apiserver what the informer needs (a list of Pods).
	probe func(context.Context) error
	start time.Time

	mu     sync.Mutex
	since  time.Time // the first failure of the outage; zero while none
	err    error     // the last failure
	count  int       // failures since the last warning
	warned time.Time // the last warning
}

func newAPIWatch(cluster string, synced func() bool, probe func(context.Context) error, log *slog.Logger, now func() time.Time) *apiWatch {
	if now == nil {
		now = time.Now
	}
	return &apiWatch{cluster: cluster, log: log, now: now, synced: synced, probe: probe, start: now()}
}

// fail records a failure to reach the apiserver, and warns unless it did
// less than warnEvery ago. A watch that ends normally or whose resource
// version expired is no failure: the informer lists again.
func (a *apiWatch) fail(err error) {
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	synced := a.synced()
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if a.since.IsZero() {
		a.since = now
	}
	a.err = err
	a.count++
	if !a.warned.IsZero() && now.Sub(a.warned) < warnEvery {
		return
	}
	msg := "apiserver unreachable: the Pod cache is not kept up to date"
	if !synced {
		msg = "apiserver unreachable: the Pod cache has not synced, not ready"
	}
	a.log.Warn(msg, "cluster", a.cluster, "error", err, "failing_for", now.Sub(a.since).Round(time.Second), "failures", a.count)
	a.warned, a.count = now, 0
}

// recovered ends an outage, logging it.
func (a *apiWatch) recovered() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.since.IsZero() {
		return
	}
	a.log.Info("apiserver reachable again", "cluster", a.cluster, "after", a.now().Sub(a.since).Round(time.Second), "last_error", a.err)
	a.since, a.err, a.count = time.Time{}, nil, 0
}

// failing returns the outage's start and last error; zero and nil while
// none.
func (a *apiWatch) failing() (time.Time, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.since, a.err
}

// check is one look of Run: while failing, a probe that succeeds with
// the informer synced ends the outage, and one that fails extends it; an
// informer that has not synced within syncGrace is a failure.
func (a *apiWatch) check(ctx context.Context) {
	since, _ := a.failing()
	synced := a.synced()
	if since.IsZero() {
		if !synced && a.now().Sub(a.start) >= syncGrace {
			a.fail(fmt.Errorf("the Pod cache has not synced in %s", a.now().Sub(a.start).Round(time.Second)))
		}
		return
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	err := a.probe(pctx)
	cancel()
	switch {
	case ctx.Err() != nil:
	case err != nil:
		a.fail(err)
	case synced:
		a.recovered()
	default:
		a.fail(errors.New("the apiserver answers, but the Pod cache has not synced yet"))
	}
}

// Run looks every apiCheckEvery until ctx ends.
func (a *apiWatch) Run(ctx context.Context) error {
	t := time.NewTicker(apiCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			a.check(ctx)
		}
	}
}

// ready is the pod-cache check.
func (a *apiWatch) ready() error {
	synced := a.synced()
	since, err := a.failing()
	switch {
	case !synced && err != nil:
		return fmt.Errorf("the Pod cache of cluster %q has not synced: list/watch failing for %s: %v",
			a.cluster, a.now().Sub(since).Round(time.Second), err)
	case !synced:
		return fmt.Errorf("the Pod cache of cluster %q has not synced", a.cluster)
	case err != nil:
		return &ca.Degraded{Err: fmt.Errorf("synced, but list/watch failing for %s: %v", a.now().Sub(since).Round(time.Second), err)}
	}
	return nil
}

// caStateCheck is the ca-state check over a backend's state in service.
func caStateCheck(be *backend, now func() time.Time) func() error {
	return func() error {
		c := be.signing()
		if c == nil {
			return errors.New("no CA state in service")
		}
		t := now()
		switch {
		case t.Before(c.NotBefore):
			return fmt.Errorf("active authority %q is not valid before %s", c.Subject, c.NotBefore.UTC().Format(time.RFC3339))
		case be.expiry != nil && t.After(be.expiry.ChainNotAfter()):
			return fmt.Errorf("active authority %q expired at %s", c.Subject, be.expiry.ChainNotAfter().UTC().Format(time.RFC3339))
		}
		return nil
	}
}

// backendHealth follows whether an external signing backend works: its
// answers to signing requests (signer.Observer), what the backend tells
// of itself (Health: a Vault login) and, when nothing has told for
// backendProbeEvery, a probe. See the readiness checks above for what it tells.
type backendHealth struct {
	name  string
	now   func() time.Time
	probe func(context.Context) error // nil: none
	log   *slog.Logger

	mu      sync.Mutex
	worked  bool      // succeeded since start
	told    time.Time // the last news, good or bad
	since   time.Time // the first failure since the last success; zero when none
	err     error
	unready bool // logged as unready
}

func newBackendHealth(name string, probe func(context.Context) error, log *slog.Logger, now func() time.Time) *backendHealth {
	if now == nil {
		now = time.Now
	}
	return &backendHealth{name: name, probe: probe, log: log, now: now}
}

// Worked implements Health.
func (h *backendHealth) Worked() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.unready {
		h.log.Info("signing backend works again", "backend", h.name, "after", h.now().Sub(h.since).Round(time.Second))
	}
	h.worked, h.told, h.since, h.err, h.unready = true, h.now(), time.Time{}, nil, false
}

// Failed implements Health.
func (h *backendHealth) Failed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.told, h.err = h.now(), err
	if h.since.IsZero() {
		h.since = h.told
	}
}

// Reason implements Health: it says why the backend fails, while it does
// (a Vault login's error, after the token lapsed); otherwise it is no news
// of its health (a failed revocation of a replaced token).
func (h *backendHealth) Reason(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.since.IsZero() && err != nil {
		h.err = err
	}
}

// ObserveSign implements signer.Observer: a signed leaf, or a refusal
// (the backend answered), is a success; a backend unavailable is a
// failure; a request its caller gave up on tells nothing.
func (h *backendHealth) ObserveSign(_ string, _ time.Duration, err error) {
	switch {
	case err == nil || signer.KindOf(err) == signer.KindRefused:
		h.Worked()
	case errors.Is(err, context.Canceled):
	case signer.KindOf(err) == signer.KindUnavailable:
		h.Failed(err)
	}
}

// ready is the signer check.
func (h *backendHealth) ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.since.IsZero() {
		return nil
	}
	took := h.now().Sub(h.since)
	var err error
	switch {
	case !h.worked:
		err = fmt.Errorf("%s has not worked since start (failing for %s): %v", h.name, took.Round(time.Second), h.err)
	case took >= backendGrace:
		err = fmt.Errorf("%s failing for %s: %v", h.name, took.Round(time.Second), h.err)
	default:
		return &ca.Degraded{Err: fmt.Errorf("%s failing for %s (unready after %s): %v", h.name, took.Round(time.Second), backendGrace, h.err)}
	}
	if !h.unready {
		h.unready = true
		h.log.Warn("signing backend failing, not ready", "backend", h.name, "error", h.err, "failing_for", took.Round(time.Second))
	}
	return err
}

// Run probes the backend at once and then whenever nothing has told how
// it is for backendProbeEvery, until ctx ends. Without a probe it
// returns at once.
func (h *backendHealth) Run(ctx context.Context) error {
	if h.probe == nil {
		return nil
	}
	t := time.NewTicker(backendProbeEvery)
	defer t.Stop()
	for first := true; ; first = false {
		h.mu.Lock()
		stale := first || h.now().Sub(h.told) >= backendProbeEvery
		h.mu.Unlock()
		if stale {
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			err := h.probe(pctx)
			cancel()
			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil:
				h.Failed(err)
			default:
				h.Worked()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// readiness lists the checks /readyz reports, in order: pod-cache,
// ca-state (with a CA state), signer (with an external backend),
// serving-cert, upstream (with an upstream that renews the intermediate);
// Assemble adds istiod-cert.
func readiness(cl *clusterParts, be *backend) ca.Readiness {
	r := ca.Readiness{{Name: "pod-cache", Check: cl.watch.ready}}
	if be.signing != nil {
		r = append(r, ca.ReadyCheck{Name: "ca-state", Check: caStateCheck(be, time.Now)})
	}
	if be.health != nil {
		r = append(r, ca.ReadyCheck{Name: "signer", Check: be.health.ready})
	}
	if be.getCert != nil {
		r = append(r, ca.ReadyCheck{Name: "serving-cert", Check: servingCheck(be, time.Now)})
	}
	if be.renewer != nil {
		r = append(r, ca.ReadyCheck{Name: "upstream", Check: upstreamCheck(be, time.Now)})
	}
	return r
}

package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/keymgrprom"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/signer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
)

// Upstream renews the built-in CA's signing intermediate from an
// upstream that keeps the root's key (keymgr.Renewer): meshca signs
// every leaf in process with an intermediate it holds, and asks the
// upstream for the next one. Backend.Upstream; nil: no intermediate is
// renewed, as before.
type Upstream struct {
	// Opener is the upstream: the command describes each one in a file
	// of its own and hands it here, never named.
	Opener UpstreamOpener
	// TTL is the intermediates' lifetime, RenewAt the fraction of it left
	// when one is renewed, Interval how often the renewer looks: the
	// keymgr.Renewer defaults when zero.
	TTL      time.Duration
	RenewAt  float64
	Interval time.Duration
}

// UpstreamOpener is an upstream as the command configured it.
type UpstreamOpener interface {
	// Name is --upstream's value: the type of the Refs it renews.
	Name() string
	// Open builds the upstream; ctx bounds that work. It starts no
	// goroutine: an upstream with a Run(ctx) error method (a Vault
	// upstream's login, renewed while it lasts) is run beside the server
	// on every replica, so that a new leader finds it logged in.
	Open(ctx context.Context, env UpstreamEnv) (upstream.Upstream, error)
}

// upstreamRunner is the Run of ren's upstream, when it has one.
func upstreamRunner(ren *keymgr.Renewer) (func(context.Context) error, bool) {
	if ren == nil {
		return nil, false
	}
	r, ok := ren.Upstream.(interface{ Run(context.Context) error })
	if !ok {
		return nil, false
	}
	return r.Run, true
}

// UpstreamEnv is what the assembly lends an upstream it opens.
type UpstreamEnv struct {
	TrustDomain spiffeid.TrustDomain
	// LocalKubeconfig is the local cluster's (empty: in-cluster).
	LocalKubeconfig string
	Registerer      prometheus.Registerer
	Log             *slog.Logger
}

// openRenewer opens c's upstream and the renewer of the CA state in
// store; nil without an upstream.
func (c Backend) openRenewer(ctx context.Context, store keymgr.StateStore, td spiffeid.TrustDomain, reg prometheus.Registerer,
	log *slog.Logger) (*keymgr.Renewer, error) {
	if c.Upstream == nil {
		return nil, nil
	}
	u, err := c.Upstream.Opener.Open(ctx, UpstreamEnv{TrustDomain: td, LocalKubeconfig: c.localKubeconfig, Registerer: reg, Log: log})
	if err != nil {
		return nil, err
	}
	kt := c.State.KeyType
	if kt == "" {
		kt = certs.KeyECP256
	}
	return &keymgr.Renewer{Store: store, Upstream: u, Name: c.Upstream.Opener.Name(), TrustDomain: td, TTL: c.Upstream.TTL,
		RenewAt: c.Upstream.RenewAt, KeyType: kt, Guards: keymgr.Guards{Margin: c.Rotation.Margin}, Interval: c.Upstream.Interval}, nil
}

// renewing wires ren's news into metrics, the audit log, the log and the
// follower f, which serves a renewal at once; it returns its loop.
func (be *backend) renewing(ctx context.Context, c Backend, ren *keymgr.Renewer, f *keymgr.Follower, metrics *keymgrprom.Metrics,
	log *slog.Logger) func(context.Context) error {
	ren.OnRenewed = func(rw keymgr.Renewal) {
		metrics.Renewal(ren.Name, keymgrprom.RenewOK, 0, time.Now())
		c.audit.Audit(ctx, intermediateEvent(rw))
		log.Info("intermediate renewed", "upstream", ren.Name, "authority", rw.New.ID(), "replaced", rw.Old.ID(),
			"not_after", rw.New.Cert.NotAfter, "clamped_to_root", rw.Clamped, "took", rw.Took)
		if _, err := f.Sync(ctx); err != nil {
			log.Error("CA state not used", "error", err)
		}
	}
	ren.OnRetired = func(s keymgr.Step) {
		metrics.Step(s.Verb)
		c.audit.Audit(ctx, &ca.AuditEvent{Event: ca.EventRotation, Decision: ca.DecisionTaken, Message: "automatic rotation step",
			Source: ca.SourceAuto, Caller: "meshca", Verb: s.Verb, Authority: s.ID, Reason: s.Why, Backend: BackendLocal, Upstream: ren.Name})
		if _, err := f.Sync(ctx); err != nil {
			log.Error("CA state not used", "error", err)
		}
	}
	ren.OnError = func(err error) {
		st := ren.Status()
		if st.Failing() && st.LastErr == err {
			metrics.Renewal(ren.Name, string(upstream.KindOf(err)), st.Failures, time.Now())
			c.audit.Audit(ctx, &ca.AuditEvent{Event: ca.EventIntermediate, Decision: ca.DecisionRefused, Source: ca.SourceAuto, Caller: "meshca",
				Backend: BackendLocal, Upstream: ren.Name, Reason: string(upstream.KindOf(err)), Detail: err.Error()})
		}
		log.Error("intermediate renewal failed; the one in service keeps signing", "upstream", ren.Name, "error", err,
			"failures", st.Failures, "retry_at", st.Retry, "intermediate_not_after", be.expiry.ChainNotAfter())
	}
	return func(ctx context.Context) error {
		metrics.RenewerStarted(ren.Name)
		defer metrics.RenewerStopped(ren.Name)
		return ren.Run(ctx)
	}
}

// intermediateEvent is the audit event of a renewal.
func intermediateEvent(rw keymgr.Renewal) *ca.AuditEvent {
	e := &ca.AuditEvent{Event: ca.EventIntermediate, Decision: ca.DecisionIssued, Source: ca.SourceAuto, Caller: "meshca",
		Backend: BackendLocal, Upstream: rw.Upstream, Authority: rw.New.ID(), Replaced: rw.Old.ID(),
		Serial: rw.New.Cert.SerialNumber.Text(16), NotAfter: rw.New.Cert.NotAfter, Latency: rw.Took}
	if rw.Clamped {
		e.Reason = "cut to its root's end"
	}
	return e
}

// renewalWhy says, for a request refused because the intermediate ends
// too soon, why ren has not renewed it; nil without a renewer.
func renewalWhy(ren *keymgr.Renewer) func() (string, error) {
	if ren == nil {
		return nil
	}
	return func() (string, error) {
		st := ren.Status()
		if !st.Failing() {
			return "", nil
		}
		return fmt.Sprintf("upstream %s failing since %s", ren.Name, st.FailingSince.UTC().Format(time.RFC3339)), st.LastErr
	}
}

// nextAuthority is automatic rotation's Generate with an upstream: the
// next root is made there (the self upstream's, in the CA state) with its
// first intermediate. Nil without one: keymgr.NextRoot.
func nextAuthority(ren *keymgr.Renewer) func(*keymgr.AuthorityRecord) (*keymgr.AuthorityRecord, error) {
	if ren == nil {
		return nil
	}
	return func(active *keymgr.AuthorityRecord) (*keymgr.AuthorityRecord, error) {
		ctx, cancel := context.WithTimeout(context.Background(), keymgr.DefaultRenewTimeout)
		defer cancel()
		return ren.NewAuthority(ctx, keymgr.NextRootOptions(active))
	}
}

// upstreamCheck is the upstream readiness check: how the renewals fare
// and how long the intermediate in service has left. It fails once the
// intermediate is too close to its end to issue a certificate of
// --default-ttl worth having (the request path refuses those then too),
// and says, on its ok
// line, that renewals fail, or that less than a quarter of the
// intermediate's life is left.
func upstreamCheck(be *backend, now func() time.Time) func() error {
	return func() error {
		ren, c := be.renewer, be.signing()
		if c == nil {
			return nil
		}
		t, end := now(), be.expiry.ChainNotAfter()
		left := end.Sub(t)
		life := fmt.Sprintf("the intermediate ends at %s (in %s)", end.UTC().Format(time.RFC3339), left.Round(time.Second))
		st := ren.Status()
		failing := ""
		if st.Failing() {
			failing = fmt.Sprintf("renewal from upstream %s failing for %s (%d attempts, next at %s): %v; ", ren.Name,
				t.Sub(st.FailingSince).Round(time.Second), st.Failures, st.Retry.UTC().Format(time.RFC3339), st.LastErr)
		}
		switch {
		case left < signer.MinLifetime(be.defaultTTL):
			return errors.New(failing + life + ": too soon to issue certificates")
		case failing != "":
			return &ca.Degraded{Err: errors.New(failing + life)}
		case left < end.Sub(c.NotBefore)/4:
			return &ca.Degraded{Err: fmt.Errorf("%s: less than a quarter of its life, and upstream %s has not renewed it (another replica renews, or this one has not yet tried)", life, ren.Name)}
		}
		return nil
	}
}

// all runs every run until ctx ends or one fails.
func all(runs []func(context.Context) error) func(context.Context) error {
	if len(runs) == 1 {
		return runs[0]
	}
	return func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		for _, run := range runs {
			g.Go(func() error { return run(ctx) })
		}
		return g.Wait()
	}
}

package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// registerDestroy registers retire's --destroy-root-key, with --upstream
// and every upstream's own flags to reach the key.
func (f *stepFlags) registerDestroy(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&f.destroyRootKey, "destroy-root-key", false, "also destroy the retired root's key where its upstream keeps it (--upstream and its settings), "+
		"once no authority under that root is left; checked before the step, which is refused when the upstream would not destroy it (docs/upstream.md)")
	fl.StringVar(&f.up.name, "upstream", "", "with --destroy-root-key: the upstream that keeps the retired root's key ("+upstreamNames()+")")
	f.up.registerAll(fl)
}

// rootDestroy is a root key that retire destroys once its step is stored.
type rootDestroy struct {
	d    upstream.KeyDestroyer
	root *x509.Certificate
	ref  upstream.Ref
}

// planDestroy checks, before the step, that --destroy-root-key can be
// honoured: the step leaves no authority under the root that is not
// retired, --upstream is the one that keeps its key, and the upstream
// would destroy it. nil without --destroy-root-key, and for a root whose
// key the state keeps (retire destroys that itself).
func (f *stepFlags) planDestroy(ctx context.Context, store keymgr.StateStore, args []string, phase keymgr.Phase, step stepFunc, log *slog.Logger) (*rootDestroy, error) {
	if !f.destroyRootKey {
		return nil, nil
	}
	cur, _, err := store.Load(ctx)
	if err != nil {
		return nil, err
	}
	rec, err := pick(cur, args, phase)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	next := cur.Clone()
	if err := step(next, rec.ID(), time.Now(), f); err != nil {
		return nil, err
	}
	if err := destroyable(next, rec); err != nil || rec.Upstream.Type == "self" {
		return nil, err
	}
	d, err := f.destroyer(ctx, rec, log)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	if err := d.CheckDestroy(ctx, rec.Root, rec.Upstream); err != nil {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("--destroy-root-key: %w; the step is not taken (retire without --destroy-root-key keeps the key)", err)}
	}
	return &rootDestroy{d: d, root: rec.Root, ref: rec.Upstream}, nil
}

// destroyable: once retired, no authority of s under rec's root is left,
// and its key is in an upstream.
func destroyable(s *keymgr.State, rec *keymgr.AuthorityRecord) error {
	if !rec.Renewed() {
		return &exitError{code: exitUsage, err: errors.New("--destroy-root-key: the root's key is not in an upstream; retire destroys a key the state keeps")}
	}
	for _, a := range s.Authorities {
		if a.Root.Equal(rec.Root) && a.Phase != keymgr.PhaseRetired {
			return &exitError{code: exitUsage, err: fmt.Errorf("--destroy-root-key: authority %.16s under the same root is %s: retire it first, then its root's key goes with the last", a.ID(), a.Phase)}
		}
	}
	return nil
}

// destroyer opens --upstream, which must keep rec's root key.
func (f *stepFlags) destroyer(ctx context.Context, rec *keymgr.AuthorityRecord, log *slog.Logger) (upstream.KeyDestroyer, error) {
	k, err := f.up.selected()
	switch {
	case err != nil:
		return nil, err
	case k == nil || k.name != rec.Upstream.Type:
		return nil, fmt.Errorf("--destroy-root-key: the root's key is in upstream %s: give --upstream %s and its settings", rec.Upstream.Type, rec.Upstream.Type)
	case k.options != nil:
		if err := f.up.options(k).validate(); err != nil {
			return nil, err
		}
	}
	o, err := k.open(&f.up, log)
	if err != nil {
		return nil, err
	}
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	u, err := o.Open(ctx, serve.UpstreamEnv{TrustDomain: td, LocalKubeconfig: f.store.cluster.kubeconfig, Registerer: prometheus.NewRegistry(), Log: log})
	if err != nil {
		return nil, err
	}
	d, ok := u.(upstream.KeyDestroyer)
	if !ok {
		return nil, fmt.Errorf("--destroy-root-key: upstream %s destroys no keys", k.name)
	}
	return d, nil
}

// destroy destroys the planned key once the step is stored in st, unless
// an authority under its root came back meanwhile.
func (p *rootDestroy) destroy(ctx context.Context, st *keymgr.State, w io.Writer) error {
	if p == nil {
		return nil
	}
	for _, a := range st.Authorities {
		if a.Root.Equal(p.root) && a.Phase != keymgr.PhaseRetired {
			return &exitError{code: exitUsage, err: fmt.Errorf("--destroy-root-key: authority %.16s under the root is %s now: its key %s is kept", a.ID(), a.Phase, upstreamKey(p.ref))}
		}
	}
	if err := p.d.DestroyRoot(ctx, p.root, p.ref); err != nil {
		return &exitError{code: exitUsage, err: fmt.Errorf("the step is stored, but the root's key %s was not destroyed: %w; destroy it in the upstream", upstreamKey(p.ref), err)}
	}
	fmt.Fprintf(w, "destroyed the root's key %s\n", upstreamKey(p.ref))
	return nil
}

// upstreamKey names a root key in its upstream.
func upstreamKey(r upstream.Ref) string { return r.Key + " in upstream " + r.Type }

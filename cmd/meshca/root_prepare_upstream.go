package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// registerUpstream registers prepare's --upstream, the first
// intermediate's lifetime, and every upstream's own flags.
func (f *prepareFlags) registerUpstream(fl *pflag.FlagSet) {
	fl.StringVar(&f.up.name, "upstream", "", "make the new root's key in this upstream ("+upstreamNames()+"), with its first intermediate, "+
		"which meshca serve --upstream renews; the trust domain (--trust-domain) is the intermediate's URI name")
	f.up.registerTTL(fl)
	f.up.registerAll(fl)
}

// inUpstream makes the authority in the upstream --upstream names: a
// new root key there and its self-signed root, and its first
// intermediate; nil without --upstream.
func (f *prepareFlags) inUpstream(ctx context.Context, s *keymgr.State, log *slog.Logger) (*keymgr.AuthorityRecord, error) {
	k, err := f.up.selected()
	switch {
	case err != nil || k == nil:
		return nil, err
	case f.signer.signer != signerLocal:
		return nil, fmt.Errorf("--upstream %s makes a root the built-in CA's intermediates are renewed under; --signer %s is not the built-in CA", k.name, f.signer.signer)
	case f.imports() || f.external:
		return nil, fmt.Errorf("--upstream %s makes a new root where it keeps keys: give no --cert, --ca-dir or --external", k.name)
	}
	f.up.renewAt = keymgr.DefaultRenewAt
	if err := f.up.validate(signerLocal, true, 0); err != nil {
		return nil, err
	}
	td, err := spiffeid.TrustDomainFromString(f.organization(s))
	if err != nil {
		return nil, fmt.Errorf("--trust-domain: %w", err)
	}
	o, err := k.open(&f.up, log)
	if err != nil {
		return nil, err
	}
	u, err := o.Open(ctx, serve.UpstreamEnv{TrustDomain: td, LocalKubeconfig: f.store.cluster.kubeconfig, Registerer: prometheus.NewRegistry(), Log: log})
	if err != nil {
		return nil, err
	}
	kt := certs.KeyType(f.keyType)
	ren := &keymgr.Renewer{Upstream: u, Name: k.name, TrustDomain: td, TTL: f.up.ttl, KeyType: kt}
	f.renewer = ren
	rec, err := ren.NewAuthority(ctx, keymgr.RootOptions{KeyType: kt, Organization: td.Name(), TTL: f.lifetime})
	if err != nil {
		return nil, fmt.Errorf("--upstream %s: %w", k.name, err)
	}
	if rec == nil {
		return nil, errors.New("--upstream " + k.name + ": no authority made")
	}
	return rec, nil
}

// discard destroys the root key of made, an authority made in an
// upstream that the CA state did not take, or says which key is left
// there; nothing without --upstream.
func (f *prepareFlags) discard(ctx context.Context, store keymgr.StateStore, made *keymgr.AuthorityRecord, err error) error {
	if f.renewer == nil || made == nil {
		return err
	}
	// The update may have been stored though it failed (its answer lost).
	if unrecorded, uerr := keymgr.Unrecorded(ctx, store, made); !unrecorded {
		if uerr != nil {
			return fmt.Errorf("%w; the new root's key %s may be left there: if meshca root status lists no authority under it, delete it", err, upstreamRef(made))
		}
		return err
	}
	destroyed, derr := f.renewer.Discard(ctx, made)
	switch {
	case derr != nil:
		return fmt.Errorf("%w; and %w", err, derr)
	case !destroyed:
		return err
	}
	return fmt.Errorf("%w; the new root's key %s, recorded nowhere, was destroyed", err, upstreamRef(made))
}

// upstreamRef names where a renewed authority's root key is.
func upstreamRef(rec *keymgr.AuthorityRecord) string {
	if rec.Upstream.Key == "" {
		return rec.Upstream.Type
	}
	return rec.Upstream.Type + " (" + rec.Upstream.Key + ")"
}

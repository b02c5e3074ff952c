package main

import (
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
)

func TestCRLFlagsValidate(t *testing.T) {
	ok := crlFlags{on: true, validity: keymgr.DefaultCRLValidity, refreshAt: keymgr.DefaultCRLRefreshAt, propagation: keymgr.DefaultCRLPropagation}
	with := func(edit func(*crlFlags)) crlFlags { f := ok; edit(&f); return f }
	// An upstream whose intermediates have 36h left when renewed, and
	// one whose have 60s (the e2e fleets').
	up := &upstreamFlags{name: "self", ttl: keymgr.DefaultIntermediateTTL, renewAt: keymgr.DefaultRenewAt}
	short := &upstreamFlags{name: "self", ttl: 80 * time.Second, renewAt: 0.75}
	tests := []struct {
		name     string
		f        crlFlags
		signer   string
		hasState bool
		publish  bool
		want     string
		up       *upstreamFlags
	}{
		{"on", ok, signerLocal, true, false, "", nil},
		{"off, whatever the rest", crlFlags{validity: -1}, "vault", false, false, "", nil},
		{"an external signer", ok, "vault", true, false, "--crl: meshca signs the CRLs of the built-in CA's authorities, and --signer vault signs elsewhere", nil},
		{"a plugged-in CA", ok, signerLocal, false, false, "--crl keeps its CRLs in a CA state: give --state-dir or --state-secret", nil},
		{"validity too short", with(func(f *crlFlags) { f.validity = time.Minute }), signerLocal, true, false, "--crl-validity 1m0s must be between 10m0s and 168h0m0s", nil},
		{"validity too long", with(func(f *crlFlags) { f.validity = 30 * 24 * time.Hour }), signerLocal, true, false, "--crl-validity 720h0m0s must be between", nil},
		{"refreshed never", with(func(f *crlFlags) { f.refreshAt = 0 }), signerLocal, true, false, "--crl-refresh-at 0 must be above 0 and at most 0.75", nil},
		{"publishing with --crl off", crlFlags{}, signerLocal, true, true, "--publish-crl with the built-in CA publishes the CRLs --crl keeps in the CA state, and --crl is off: add --crl", nil},
		{"publishing Vault's CRLs without --crl", crlFlags{}, "vault", false, true, "", nil},
		{"publishing with --crl on", ok, signerLocal, true, true, "", nil},
		{"refreshed too late", with(func(f *crlFlags) { f.refreshAt = 0.9 }), signerLocal, true, false, "--crl-refresh-at 0.9 must be above 0 and at most 0.75", nil},
		{"propagation negative", with(func(f *crlFlags) { f.propagation = -time.Second }), signerLocal, true, false, "--crl-propagation -1s must be between 0 and 1h0m0s", nil},
		{"propagation over an hour", with(func(f *crlFlags) { f.propagation = 2 * time.Hour }), signerLocal, true, false, "--crl-propagation 2h0m0s must be between 0 and 1h0m0s", nil},
		{"propagation off", with(func(f *crlFlags) { f.propagation = 0 }), signerLocal, true, false, "", short},
		{"the default under the default upstream", ok, signerLocal, true, false, "", up},
		{"a short intermediate outlives a short propagation", with(func(f *crlFlags) { f.propagation = 5 * time.Second }), signerLocal, true, false, "", short},
		{"the default propagation outlives a short intermediate", ok, signerLocal, true, false,
			"--crl-propagation with --intermediate-ttl 1m20s and --intermediate-renew-at 0.75: the CRL propagation time 2m0s is not shorter than the time between two renewals (20s)", short},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			upf := tt.up
			if upf == nil {
				upf = &upstreamFlags{}
			}
			err := tt.f.validate(tt.signer, tt.hasState, tt.publish, upf)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("validate = %v, want %q", err, tt.want)
			}
		})
	}
	if c := ok.config(); c == nil || c.Validity != keymgr.DefaultCRLValidity || c.RefreshAt != keymgr.DefaultCRLRefreshAt || c.Propagation != keymgr.DefaultCRLPropagation {
		t.Fatalf("config() = %+v", c)
	}
	if (&crlFlags{}).config() != nil {
		t.Fatal("config() of --crl=false is not nil")
	}
}

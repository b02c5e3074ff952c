package main

import (
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
)

func TestCRLFlagsValidate(t *testing.T) {
	ok := crlFlags{on: true, validity: keymgr.DefaultCRLValidity, refreshAt: keymgr.DefaultCRLRefreshAt}
	with := func(edit func(*crlFlags)) crlFlags { f := ok; edit(&f); return f }
	tests := []struct {
		name     string
		f        crlFlags
		signer   string
		hasState bool
		publish  bool
		want     string
	}{
		{"on", ok, signerLocal, true, false, ""},
		{"off, whatever the rest", crlFlags{validity: -1}, "vault", false, false, ""},
		{"an external signer", ok, "vault", true, false, "--crl: meshca signs the CRLs of the built-in CA's authorities, and --signer vault signs elsewhere"},
		{"a plugged-in CA", ok, signerLocal, false, false, "--crl keeps its CRLs in a CA state: give --state-dir or --state-secret"},
		{"validity too short", with(func(f *crlFlags) { f.validity = time.Minute }), signerLocal, true, false, "--crl-validity 1m0s must be between 10m0s and 168h0m0s"},
		{"validity too long", with(func(f *crlFlags) { f.validity = 30 * 24 * time.Hour }), signerLocal, true, false, "--crl-validity 720h0m0s must be between"},
		{"refreshed never", with(func(f *crlFlags) { f.refreshAt = 0 }), signerLocal, true, false, "--crl-refresh-at 0 must be above 0 and at most 0.75"},
		{"publishing with --crl off", crlFlags{}, signerLocal, true, true, "--publish-crl with the built-in CA publishes the CRLs --crl keeps in the CA state, and --crl is off: add --crl"},
		{"publishing Vault's CRLs without --crl", crlFlags{}, "vault", false, true, ""},
		{"publishing with --crl on", ok, signerLocal, true, true, ""},
		{"refreshed too late", with(func(f *crlFlags) { f.refreshAt = 0.9 }), signerLocal, true, false, "--crl-refresh-at 0.9 must be above 0 and at most 0.75"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.f.validate(tt.signer, tt.hasState, tt.publish)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("validate = %v, want %q", err, tt.want)
			}
		})
	}
	if c := ok.config(); c == nil || c.Validity != keymgr.DefaultCRLValidity || c.RefreshAt != keymgr.DefaultCRLRefreshAt {
		t.Fatalf("config() = %+v", c)
	}
	if (&crlFlags{}).config() != nil {
		t.Fatal("config() of --crl=false is not nil")
	}
}

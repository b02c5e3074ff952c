package main

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/spf13/pflag"
)

// TestUpstreamFlags: --upstream is checked before anything is read, with
// a message that names the way out.
func TestUpstreamFlags(t *testing.T) {
	dir := t.TempDir()
	st := "--state-dir=" + dir
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"self", []string{st, "--upstream=self"}, ""},
		{"none", []string{st}, ""},
		{"unknown", []string{st, "--upstream=hsm"}, `--upstream "hsm" is not one of`},
		{"another signer", []string{st, "--upstream=self", "--signer=cfssl", "--cfssl-url=https://127.0.0.1:1", "--serving-cert-file=x", "--serving-key-file=y"},
			"--upstream self renews the built-in CA's signing intermediate, and --signer cfssl signs elsewhere"},
		{"plugged-in CA", []string{"--ca-dir=" + dir, "--upstream=self"}, "give --state-dir or --state-secret"},
		{"short intermediate", []string{st, "--upstream=self", "--intermediate-ttl=30s"}, "--intermediate-ttl 30s must be at least 1m"},
		{"renew at 1", []string{st, "--upstream=self", "--intermediate-renew-at=1"}, "--intermediate-renew-at 1 must be above 0.25"},
		{"a renewal too late for a day's leaves", []string{st, "--upstream=self", "--intermediate-ttl=1m"},
			"--intermediate-ttl 1m0s × --intermediate-renew-at 0.5 leaves 30s at a renewal; it must leave at least 2m0s for leaves of --default-ttl 24h0m0s"},
		{"short intermediates for short leaves", []string{st, "--upstream=self", "--intermediate-ttl=1m", "--default-ttl=20s", "--max-ttl=20s"}, ""},
		{"renew at a fifth", []string{st, "--upstream=self", "--intermediate-renew-at=0.2"}, "must be above 0.25 (MeshcaIntermediateExpiringSoon fires below it)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runPrintConfig(t, tt.args, nil)
			switch {
			case tt.want == "" && err != nil:
				t.Fatal(err)
			case tt.want == "":
				if !strings.Contains(out, "intermediateTTL: ") {
					t.Fatalf("no intermediateTTL in:\n%s", out)
				}
			case err == nil || !strings.Contains(err.Error(), tt.want):
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// fakeOptions are flags of a test upstream "vault-fake", named like the
// vault signer's so that their sections must be told apart.
type fakeOptions struct{ key, mount string }

func (f *fakeOptions) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.key, "vault-fake-key", "", "")
	fl.StringVar(&f.mount, "vault-fake-mount", "", "")
}
func (f *fakeOptions) validate() error { return nil }
func (f *fakeOptions) opener(*slog.Logger) (serve.UpstreamOpener, error) {
	return nil, nil
}

// TestUpstreamConfigKeys: an upstream's flags are keys of its own
// section, even when its name starts like a signer's.
func TestUpstreamConfigKeys(t *testing.T) {
	saved := slices.Clone(upstreamKinds)
	t.Cleanup(func() { upstreamKinds = saved })
	registerUpstream(&upstreamKind{name: "vault-fake", options: func() upstreamOptions { return &fakeOptions{} }})
	for flag, want := range map[string]string{
		"vault-fake-key": "vaultFake.key", "vault-fake-mount": "vaultFake.mount", "vault-pki-mount": "vault.pkiMount",
		"upstream": "upstream", "intermediate-ttl": "intermediateTTL", "intermediate-renew-at": "intermediateRenewAt",
	} {
		if got := configKey(flag); got != want {
			t.Errorf("configKey(%q) = %q, want %q", flag, got, want)
		}
	}
	if got := name("vault-fake-key"); got != "--vault-fake-key (vaultFake.key)" {
		t.Errorf("name = %q", got)
	}
}

// TestRootPrepareUpstream: `meshca root prepare --upstream self` makes a
// root with its key in the state and its first intermediate; status shows
// the intermediate, its upstream and what is left of it.
func TestRootPrepareUpstream(t *testing.T) {
	st := "--state-dir=" + filepath.Join(t.TempDir(), "state")
	out, code := rootCmd(t, "prepare", st, "--upstream", "self", "--intermediate-ttl", "2h", "--trust-domain", "example.org")
	if code != 0 || !strings.Contains(out, "its root's key is in upstream self") || !strings.Contains(out, `"event":"intermediate"`) {
		t.Fatalf("prepare: exit %d\n%s", code, out)
	}
	out, code = rootCmd(t, "status", st)
	if code != 0 || !strings.Contains(out, "renewed from upstream self") || !strings.Contains(out, "in 1h59m") && !strings.Contains(out, "in 2h0m0s") {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	out, _ = rootCmd(t, "status", st, "-o", "json")
	var v struct {
		Authorities []struct {
			Upstream *upstream.Ref
			Signing  *struct{ Subject string }
		}
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v.Authorities) != 1 || v.Authorities[0].Upstream == nil ||
		v.Authorities[0].Upstream.Type != "self" || v.Authorities[0].Signing == nil {
		t.Fatalf("status -o json: %v\n%s", err, out)
	}
	for _, args := range [][]string{
		{"prepare", st, "--upstream", "self", "--ca-dir", "x"},
		{"prepare", st, "--upstream", "self", "--signer", "vault"},
		{"prepare", st, "--upstream", "nope"},
	} {
		if out, code := rootCmd(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2\n%s", args, code, out)
		}
	}
}

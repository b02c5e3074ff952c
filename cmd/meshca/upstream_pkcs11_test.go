package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr/upstream/pkcs11"
)

// TestPKCS11Flags: --upstream pkcs11's settings are checked before
// anything is read, with a message that names the way out; the default
// build refuses it whatever the settings, and names the build that has
// it. make test-hsm runs this test in the HSM build too.
func TestPKCS11Flags(t *testing.T) {
	st := "--state-dir=" + t.TempDir()
	mod := "--pkcs11-module=/usr/lib/softhsm/libsofthsm2.so"
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"by label", []string{st, "--upstream=pkcs11", mod, "--pkcs11-token-label=meshca", "--pkcs11-pin-file=/pin"}, ""},
		{"by slot", []string{st, "--upstream=pkcs11", mod, "--pkcs11-slot=0", "--pkcs11-pin-file=/pin"}, ""},
		{"no module", []string{st, "--upstream=pkcs11", "--pkcs11-token-label=meshca"}, "--upstream pkcs11 needs the HSM's module: give --pkcs11-module (pkcs11.module)"},
		{"no token", []string{st, "--upstream=pkcs11", mod}, "give --pkcs11-token-label (pkcs11.tokenLabel) or --pkcs11-slot (pkcs11.slot)"},
		{"label and slot", []string{st, "--upstream=pkcs11", mod, "--pkcs11-token-label=meshca", "--pkcs11-slot=0"}, "both name the token: give one"},
		{"another signer", []string{st, "--upstream=pkcs11", mod, "--pkcs11-token-label=meshca", "--signer=cfssl", "--cfssl-url=https://127.0.0.1:1",
			"--serving-cert-file=x", "--serving-key-file=y"}, "--signer cfssl signs elsewhere"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runPrintConfig(t, tt.args, nil)
			want := tt.want
			if !pkcs11.Supported && !strings.Contains(tt.name, "signer") {
				want = "--upstream pkcs11: this meshca was built without PKCS#11 support; use the meshca-hsm build or image"
			}
			switch {
			case want == "" && err != nil:
				t.Fatal(err)
			case want == "":
				if l := line(t, out, "tokenLabel"); !strings.HasPrefix(l, "tokenLabel: ") {
					t.Fatalf("no pkcs11 section in:\n%s", out)
				}
			case err == nil || !strings.Contains(err.Error(), want):
				t.Fatalf("err = %v, want %q", err, want)
			}
		})
	}
}

// TestPKCS11PIN: the PIN comes from its file, else MESHCA_PKCS11_PIN,
// else meshca refuses to start; it is never a setting (--print-config
// shows the file's name, not the PIN).
func TestPKCS11PIN(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pin")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, file, env, want, err string
	}{
		{"file", file, "", "from-file", ""},
		{"file over env", file, "from-env", "from-file", ""},
		{"env", "", "from-env", "from-env", ""},
		{"none", "", "", "", "--upstream pkcs11 needs the token's user PIN: give --pkcs11-pin-file (pkcs11.pinFile) or set MESHCA_PKCS11_PIN"},
		{"missing file", file + ".gone", "", "", "--pkcs11-pin-file (pkcs11.pinFile): open "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(envPKCS11PIN, tt.env)
			o := &pkcs11Options{module: "/m.so", tokenLabel: "meshca", pinFile: tt.file, slot: -1}
			op, err := o.opener(nil)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := op.(pkcs11Opener).cfg.PIN; got != tt.want {
				t.Fatalf("PIN %q, want %q", got, tt.want)
			}
		})
	}
	out, err := runPrintConfig(t, []string{"--state-dir=" + t.TempDir(), "--upstream=pkcs11", "--pkcs11-module=/m.so", "--pkcs11-token-label=meshca",
		"--pkcs11-pin-file=" + file}, map[string]string{envPKCS11PIN: "pin-in-env"})
	if strings.Contains(out, "from-file") || strings.Contains(out, "pin-in-env") {
		t.Fatalf("--print-config shows the PIN:\n%s", out)
	}
	if !pkcs11.Supported && err == nil {
		t.Fatal("the default build accepted --upstream pkcs11")
	}
}

// TestPKCS11OpenRefusesBadModule: serve stops at start on a module that
// does not load, rather than find out at the first renewal; the default
// build stops on its own refusal.
func TestPKCS11OpenRefusesBadModule(t *testing.T) {
	op := pkcs11Opener{cfg: pkcs11.Config{Module: filepath.Join(t.TempDir(), "libabsent.so"), TokenLabel: "meshca", PIN: "1234"}}
	_, err := op.Open(context.Background(), serve.UpstreamEnv{})
	want := "failed to open module"
	if !pkcs11.Supported {
		want = pkcs11.NotBuilt
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Open: %v, want %q", err, want)
	}
}

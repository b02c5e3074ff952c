package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// TestPrepareExternal: --external imports an external backend's signing
// authority without its key: a root alone, or an intermediate with its
// root (and the chain between), which keymgr holds to chain to the root.
func TestPrepareExternal(t *testing.T) {
	root := testca.NewRoot(t, "external root", testca.Options{})
	mid := root.NewIntermediate(t, "external middle", testca.Options{})
	issuing := mid.NewIntermediate(t, "external issuing", testca.Options{})
	stranger := testca.NewRoot(t, "another root", testca.Options{})
	files := t.TempDir()
	write := func(name string, ca ...*testca.CA) string {
		var pem []byte
		for _, c := range ca {
			pem = append(pem, pemutil.EncodeCertificates(c.Cert)...)
		}
		p := filepath.Join(files, name)
		if err := os.WriteFile(p, pem, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := filepath.Join(files, "key.pem")
	keyPEM, err := pemutil.EncodePrivateKey(issuing.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string
		code  int
		want  string
		check func(t *testing.T, rec *keymgr.AuthorityRecord)
	}{
		{name: "a root", args: []string{"--cert", write("root.pem", root)}, want: "active",
			check: func(t *testing.T, rec *keymgr.AuthorityRecord) {
				if !rec.External || !rec.Cert.Equal(root.Cert) || !rec.Root.Equal(root.Cert) || len(rec.Chain) != 0 {
					t.Errorf("record %+v: want the root alone, external", rec)
				}
			}},
		{name: "an intermediate under its root", args: []string{"--cert", write("issuing.pem", issuing), "--chain", write("mid.pem", mid),
			"--root", write("root.pem", root)}, want: "active",
			check: func(t *testing.T, rec *keymgr.AuthorityRecord) {
				if !rec.External || !rec.Cert.Equal(issuing.Cert) || !rec.Root.Equal(root.Cert) || len(rec.Chain) != 1 || !rec.Chain[0].Equal(mid.Cert) {
					t.Errorf("record %+v: want the issuing certificate, its chain and root, external", rec)
				}
				if got := rec.Intermediates(); len(got) != 2 || !got[0].Equal(issuing.Cert) || !got[1].Equal(mid.Cert) {
					t.Errorf("a leaf under it would be sent with %d intermediates, want the issuing and middle ones", len(got))
				}
			}},
		{name: "an intermediate without its root", args: []string{"--cert", write("issuing.pem", issuing)}, code: 2,
			want: `is not a root (its issuer is "CN=external middle,O=meshca test"): give its root with --root, and --chain for the intermediates between`},
		{name: "a root that did not sign it", args: []string{"--cert", write("issuing.pem", issuing), "--chain", write("mid.pem", mid),
			"--root", write("stranger.pem", stranger)}, code: 2, want: "does not chain to the root"},
		{name: "a key", args: []string{"--cert", write("issuing.pem", issuing), "--key", key, "--root", write("root.pem", root)}, code: 2,
			want: "--external imports certificates whose key lives in the backend: give no --key"},
		{name: "no certificate", code: 2, want: "--external imports the backend's signing certificate: give it with --cert"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			out, code := rootCmd(t, append([]string{"prepare", "--state-dir=" + dir, "--external"}, tt.args...)...)
			if code != tt.code || !strings.Contains(out, tt.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tt.code, tt.want, out)
			}
			if tt.check == nil {
				return
			}
			s, _, err := dirstore.Store{Dir: dir}.Load(context.Background())
			if err != nil || s.Active() == nil {
				t.Fatalf("state after import: %v", err)
			}
			tt.check(t, s.Active())
			out, code = rootCmd(t, "status", "--state-dir="+dir)
			if !s.Active().Cert.Equal(s.Active().Root) && (code != 0 || !strings.Contains(out, "signs with intermediate CN=external issuing")) {
				t.Errorf("status: exit %d, want the intermediate it signs with named:\n%s", code, out)
			}
		})
	}
}

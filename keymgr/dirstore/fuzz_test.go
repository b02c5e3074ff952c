package dirstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/storetest"
)

// fuzzNow is the clock of the fuzz targets: their seeds are valid then,
// whenever the targets run, so that a stored input reproduces.
var fuzzNow = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)

// fuzzCAOptions are certificates valid around fuzzNow.
var fuzzCAOptions = testca.Options{NotBefore: fuzzNow.Add(-time.Hour), NotAfter: fuzzNow.Add(365 * 24 * time.Hour)}

// fuzzState is a CA state as a rotation leaves it, with every kind of
// authority a store holds: a retired generated root (no key), the previous
// imported intermediate under its own root (with a chain), the active
// generated root with leaves recorded, and a prepared external root
// without a key.
func fuzzState(tb testing.TB) *keymgr.State {
	tb.Helper()
	retired := storetest.NewRecord(tb, keymgr.PhaseRetired, fuzzNow.Add(-2*time.Hour))
	retired.Key = nil
	root := testca.NewRoot(tb, "imported root", fuzzCAOptions)
	mid := root.NewIntermediate(tb, "imported intermediate 1", fuzzCAOptions)
	leafCA := mid.NewIntermediate(tb, "imported intermediate 2", fuzzCAOptions)
	previous := &keymgr.AuthorityRecord{
		Phase: keymgr.PhasePrevious, Root: root.Cert, Cert: leafCA.Cert, Chain: leafCA.Authority().Chain, Key: leafCA.Key,
		LongestLeafTTL: 24 * time.Hour, LatestLeafNotAfter: fuzzNow.Add(12 * time.Hour),
		History: []keymgr.Transition{
			{To: keymgr.PhaseActive, At: fuzzNow.Add(-time.Hour), Reason: "imported"},
			{To: keymgr.PhasePrevious, At: fuzzNow, Reason: "meshca root activate", Forced: true},
		},
	}
	active := storetest.NewRecord(tb, keymgr.PhaseActive, fuzzNow)
	active.LongestLeafTTL, active.LatestLeafNotAfter = time.Hour, fuzzNow.Add(time.Hour+time.Nanosecond)
	external := testca.NewRoot(tb, "vault root", fuzzCAOptions)
	return &keymgr.State{Sequence: 7, Authorities: []*keymgr.AuthorityRecord{
		retired, previous, active,
		{Phase: keymgr.PhasePrepared, Root: external.Cert, Cert: external.Cert, External: true,
			History: []keymgr.Transition{{To: keymgr.PhasePrepared, At: fuzzNow, Reason: "meshca root prepare --external"}}},
	}}
}

// fuzzFileName reports whether name can be written as a file of a
// directory: one path element.
func fuzzFileName(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) < 200 &&
		filepath.Base(name) == name && !strings.ContainsAny(name, "/\x00")
}

func fuzzWrite(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// requireRoundTrip fails unless s encodes, and decodes again to itself.
func requireRoundTrip(t *testing.T, s *keymgr.State) {
	t.Helper()
	entries, err := keymgr.EncodeState(s)
	if err != nil {
		t.Fatalf("a loaded state does not encode: %v", err)
	}
	again, err := keymgr.DecodeState(entries)
	if err != nil {
		t.Fatalf("a loaded state, encoded, does not decode: %v", err)
	}
	if d := storetest.Diff(again, s); d != "" {
		t.Fatalf("encoding a loaded state changed it: %s", d)
	}
}

// requireFileError fails unless err is a *keymgr.FileError naming a file
// in dir.
func requireFileError(t *testing.T, err error, dir string) {
	t.Helper()
	var fe *keymgr.FileError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v (%T) is not a *keymgr.FileError", err, err)
	}
	if fe.Path != dir && !strings.HasPrefix(fe.Path, dir+string(filepath.Separator)) {
		t.Fatalf("error names %q, outside the directory %q", fe.Path, dir)
	}
}

// FuzzLoad feeds a state directory (meshca serve --state-dir)
// what anyone who can write to it could leave there: any state.json and
// any two key files, through dirstore.Store.Load, the loader serve and
// `meshca root` use. It must never panic; a refusal is a *FileError naming
// a file of the directory; a state it loads carries the Version of its
// state.json, encodes, and decodes again to itself.
func FuzzLoad(f *testing.F) {
	s := fuzzState(f)
	entries, err := keymgr.EncodeState(s)
	if err != nil {
		f.Fatal(err)
	}
	if len(entries) != 3 {
		f.Fatalf("the seed state has %d entries, want state.json and 2 keys", len(entries))
	}
	doc := entries[dirstore.FileState]
	prevKey, activeKey := keymgr.KeyEntry(s.Authorities[1].Cert), keymgr.KeyEntry(s.Authorities[2].Cert)
	f.Add(doc, prevKey, entries[prevKey], activeKey, entries[activeKey])
	f.Add(doc, prevKey, entries[prevKey], "", []byte(nil)) // a key missing
	one := &keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{s.Authorities[2]}}
	oneEntries, err := keymgr.EncodeState(one)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(oneEntries[dirstore.FileState], activeKey, entries[activeKey], "", []byte(nil))
	f.Add(oneEntries[dirstore.FileState], activeKey, entries[activeKey], "key-0123456789abcdef.pem", entries[prevKey]) // a stray key file
	f.Add(oneEntries[dirstore.FileState], activeKey, entries[prevKey], "", []byte(nil))                                // the wrong key
	f.Add([]byte(`{"format":1,"sequence":0,"authorities":[]}`), "", []byte(nil), "", []byte(nil))
	f.Add([]byte(`{"format":2,"sequence":1,"authorities":[]}`), "", []byte(nil), "", []byte(nil))
	f.Add([]byte(`{"format":1,"authorities":[{"id":"x","phase":"active","root":"","cert":"","key":"../ca-key.pem","history":[]}]}`), "ca-key.pem", entries[activeKey], "", []byte(nil))
	f.Add([]byte{}, "", []byte(nil), "", []byte(nil))

	f.Fuzz(func(t *testing.T, doc []byte, name1 string, key1 []byte, name2 string, key2 []byte) {
		dir := t.TempDir()
		fuzzWrite(t, dir, dirstore.FileState, doc)
		for _, k := range []struct {
			name string
			data []byte
		}{{name1, key1}, {name2, key2}} {
			if k.name != dirstore.FileState && fuzzFileName(k.name) {
				fuzzWrite(t, dir, k.name, k.data)
			}
		}
		s, v, err := dirstore.Store{Dir: dir}.Load(context.Background())
		if err != nil {
			if s != nil || v != "" {
				t.Fatalf("Load returned a state or version along with %v", err)
			}
			requireFileError(t, err, dir)
			return
		}
		sum := sha256.Sum256(doc)
		if want := keymgr.Version(hex.EncodeToString(sum[:])); v != want {
			t.Fatalf("Version = %q, want the SHA-256 of state.json, %q", v, want)
		}
		requireRoundTrip(t, s)
	})
}

// FuzzLoadCACerts feeds a plugged-in CA directory (meshca serve --ca-dir,
// Istio's cacerts Secret mounted as files, or the kubernetes.io/tls
// layout) any certificate, key, chain and roots files, through
// LoadCACerts; and, in the cacerts layout, a state directory holding
// them without state.json (the single-root layout meshca once wrote)
// through dirstore.Store.Load, which migrates it. Neither may panic, and each
// refusal is a *FileError naming a file of the directory. An authority
// LoadCACerts returns validates at the time it was loaded for. A state
// dirstore.Store makes of the files validates, has one active authority signing
// with ca-cert.pem's certificate and the key that matches it, and encodes
// and decodes again to itself.
func FuzzLoadCACerts(f *testing.F) {
	root := testca.NewRoot(f, "plugged root", fuzzCAOptions)
	inter := root.NewIntermediate(f, "plugged intermediate", fuzzCAOptions)
	leafCA := inter.NewIntermediate(f, "plugged intermediate 2", fuzzCAOptions)
	next := testca.NewRoot(f, "next root", fuzzCAOptions)
	key := func(ca *testca.CA) []byte {
		p, err := pemutil.EncodePrivateKey(ca.Key)
		if err != nil {
			f.Fatal(err)
		}
		return p
	}
	enc := pemutil.EncodeCertificates
	// The layout LoadOrCreate wrote: a root that signs.
	f.Add(false, enc(root.Cert), key(root), enc(root.Cert), enc(root.Cert))
	// Istio's plugged-in CA: cert-chain.pem from the signing cert to the
	// root.
	f.Add(false, enc(inter.Cert), key(inter), enc(inter.Cert, root.Cert), enc(root.Cert))
	// Two intermediates, two roots in the bundle during a rotation.
	f.Add(false, enc(leafCA.Cert), key(leafCA), enc(leafCA.Cert, inter.Cert), enc(root.Cert, next.Cert))
	// Without cert-chain.pem; with a key that does not match.
	f.Add(false, enc(root.Cert), key(root), []byte(nil), enc(next.Cert, root.Cert))
	f.Add(false, enc(inter.Cert), key(root), enc(inter.Cert), enc(root.Cert))
	// cert-manager's kubernetes.io/tls Secret: tls.crt holds the chain.
	f.Add(true, enc(leafCA.Cert), key(leafCA), enc(inter.Cert), enc(root.Cert))
	f.Add(true, enc(root.Cert), key(root), []byte(nil), enc(root.Cert))

	f.Fuzz(func(t *testing.T, tlsLayout bool, cert, keyPEM, chain, roots []byte) {
		dir := t.TempDir()
		if tlsLayout {
			fuzzWrite(t, dir, keymgr.FileTLSCert, append(append([]byte{}, cert...), chain...))
			fuzzWrite(t, dir, keymgr.FileTLSKey, keyPEM)
			fuzzWrite(t, dir, keymgr.FileTLSCA, roots)
		} else {
			fuzzWrite(t, dir, keymgr.FileCACert, cert)
			fuzzWrite(t, dir, keymgr.FileCAKey, keyPEM)
			fuzzWrite(t, dir, keymgr.FileRootCert, roots)
			if len(chain) > 0 {
				fuzzWrite(t, dir, keymgr.FileCertChain, chain)
			}
		}
		a, err := keymgr.LoadCACerts(dir, fuzzNow)
		if err != nil {
			requireFileError(t, err, dir)
		} else if err := a.Validate(fuzzNow); err != nil {
			t.Fatalf("LoadCACerts returned an authority that does not validate: %v", err)
		}
		if tlsLayout {
			return
		}
		s, v, err := dirstore.Store{Dir: dir}.Load(context.Background())
		if err != nil {
			requireFileError(t, err, dir)
			return
		}
		if v != "" {
			t.Fatalf("a directory without state.json loaded at Version %q", v)
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("the state migrated from the single-root layout does not validate: %v", err)
		}
		active := s.Active()
		certs, err := pemutil.ParseCertificates(cert)
		switch {
		case err != nil:
			t.Fatalf("dirstore.Store loaded a ca-cert.pem that does not parse: %v", err)
		case active == nil || active.Key == nil:
			t.Fatal("the migrated state has no active authority with a key")
		case !active.Cert.Equal(certs[0]):
			t.Fatal("the active authority does not sign with ca-cert.pem's certificate")
		case !csr.SamePublicKey(active.Key.Public(), active.Cert.PublicKey):
			t.Fatal("the active authority's key does not match its certificate")
		}
		requireRoundTrip(t, s)
	})
}

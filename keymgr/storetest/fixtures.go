package storetest

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
)

// phaseOrder is the order an authority goes through its phases.
var phaseOrder = []keymgr.Phase{keymgr.PhasePrepared, keymgr.PhaseActive, keymgr.PhasePrevious, keymgr.PhaseRetired}

// NewRecord returns an authority in phase p: a fresh ECDSA P-256 root
// from keymgr.NewRoot that signs itself, with its key (even when p is
// retired: a store must destroy it), Generated, and a history that went
// through every phase up to p, one minute apart, ending at at.
func NewRecord(tb testing.TB, p keymgr.Phase, at time.Time) *keymgr.AuthorityRecord {
	tb.Helper()
	return newRecord(tb, p, at, certs.KeyECP256)
}

func newRecord(tb testing.TB, p keymgr.Phase, at time.Time, kt certs.KeyType) *keymgr.AuthorityRecord {
	tb.Helper()
	a, err := keymgr.NewRoot(keymgr.RootOptions{KeyType: kt, Organization: "storetest.example", Now: at})
	if err != nil {
		tb.Fatal(err)
	}
	return &keymgr.AuthorityRecord{
		Phase: p, Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true,
		History: historyTo(p, at),
	}
}

// NewIntermediateRecords returns an authority in each of phases, all
// under one new root: their leaves are signed by intermediates of their
// own two levels below it, under one intermediate they share. They are
// imported (not Generated), as an operator renews an intermediate under
// the root workloads trust.
func NewIntermediateRecords(tb testing.TB, at time.Time, phases ...keymgr.Phase) []*keymgr.AuthorityRecord {
	tb.Helper()
	root, err := keymgr.NewRoot(keymgr.RootOptions{Organization: "storetest.example", Now: at})
	if err != nil {
		tb.Fatal(err)
	}
	mid := issueCA(tb, root, "storetest intermediate 1", at)
	out := make([]*keymgr.AuthorityRecord, 0, len(phases))
	for i, p := range phases {
		leafCA := issueCA(tb, mid, fmt.Sprintf("storetest intermediate 2.%d", i+1), at)
		out = append(out, &keymgr.AuthorityRecord{
			Phase: p, Root: root.Cert, Cert: leafCA.Cert, Chain: []*x509.Certificate{mid.Cert}, Key: leafCA.Key,
			History: historyTo(p, at),
		})
	}
	return out
}

// NewRenewedRecords returns an authority in each of phases, all under one
// new root whose intermediates meshca renews from the upstream ref
// names, each signed by the root directly. With the self upstream the
// root's key is the CA state's: every authority that is not retired
// holds it (RootKey). They are Generated, as meshca generates the
// intermediates' keys and, for self, the root's.
func NewRenewedRecords(tb testing.TB, at time.Time, ref upstream.Ref, phases ...keymgr.Phase) []*keymgr.AuthorityRecord {
	tb.Helper()
	root, err := keymgr.NewRoot(keymgr.RootOptions{Organization: "storetest.example", Now: at})
	if err != nil {
		tb.Fatal(err)
	}
	out := make([]*keymgr.AuthorityRecord, 0, len(phases))
	for i, p := range phases {
		inter := issueCA(tb, root, fmt.Sprintf("storetest renewed intermediate %d", i+1), at)
		r := &keymgr.AuthorityRecord{Phase: p, Root: root.Cert, Cert: inter.Cert, Key: inter.Key, Upstream: ref, Generated: true, History: historyTo(p, at)}
		if ref.Type == "self" && p != keymgr.PhaseRetired {
			r.RootKey = root.Key
		}
		out = append(out, r)
	}
	return out
}

// issueCA signs a new CA certificate with parent.
func issueCA(tb testing.TB, parent *keymgr.Authority, name string, at time.Time) *keymgr.Authority {
	tb.Helper()
	key, err := certs.GenerateKey(certs.KeyECP256)
	if err != nil {
		tb.Fatal(err)
	}
	serial, err := certs.NewSerial()
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"storetest.example"}},
		NotBefore:             at.Add(-time.Hour),
		NotAfter:              at.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent.Cert, key.Public(), parent.Key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return &keymgr.Authority{Cert: cert, Key: key, Roots: parent.Roots}
}

// historyTo is a history through every phase up to p, ending at at.
func historyTo(p keymgr.Phase, at time.Time) []keymgr.Transition {
	n := 0
	for i, q := range phaseOrder {
		if q == p {
			n = i + 1
		}
	}
	h := make([]keymgr.Transition, n)
	for i := range h {
		h[i] = keymgr.Transition{To: phaseOrder[i], At: at.Add(time.Duration(i-n+1) * time.Minute), Reason: fmt.Sprintf("storetest: step %d", i+1)}
	}
	if n > 1 {
		h[n-1].Forced, h[n-1].Reason = true, "storetest: forced, as an operator's --reason says"
	}
	return h
}

// Diff describes the first difference between the state a store loaded
// and the one that was saved, or returns "" when there is none. It
// compares certificates by Equal, keys by their public halves (a retired
// authority must come back without a key), times to the second.
func Diff(got, want *keymgr.State) string {
	switch {
	case got == nil || want == nil:
		return fmt.Sprintf("state is %v, want %v", got, want)
	case got.Sequence != want.Sequence:
		return fmt.Sprintf("Sequence = %d, want %d", got.Sequence, want.Sequence)
	case len(got.Authorities) != len(want.Authorities):
		return fmt.Sprintf("%d authorities, want %d", len(got.Authorities), len(want.Authorities))
	}
	for i, w := range want.Authorities {
		if d := diffRecord(got.Authorities[i], w); d != "" {
			return fmt.Sprintf("authority %d (%.16s): %s", i+1, w.ID(), d)
		}
	}
	return diffRevocations(got, want)
}

// diffRevocations compares the revocations, node blocks and CRLs.
func diffRevocations(got, want *keymgr.State) string {
	switch {
	case len(got.Revocations) != len(want.Revocations):
		return fmt.Sprintf("%d revocations, want %d", len(got.Revocations), len(want.Revocations))
	case len(got.Blocked) != len(want.Blocked):
		return fmt.Sprintf("%d node blocks, want %d", len(got.Blocked), len(want.Blocked))
	case len(got.CRLs) != len(want.CRLs):
		return fmt.Sprintf("%d CRLs, want %d", len(got.CRLs), len(want.CRLs))
	}
	for i, w := range want.Revocations {
		g := got.Revocations[i]
		if g.Serial.Cmp(w.Serial) != 0 || g.Issuer != w.Issuer || g.Reason != w.Reason || g.Subject != w.Subject ||
			g.Node != w.Node || g.By != w.By || !sameSecond(g.RevokedAt, w.RevokedAt) || !sameSecond(g.NotAfter, w.NotAfter) {
			return fmt.Sprintf("revocation %d = %+v, want %+v", i+1, g, w)
		}
	}
	for i, w := range want.Blocked {
		g := got.Blocked[i]
		if g.Node != w.Node || g.Reason != w.Reason || g.By != w.By || !sameSecond(g.Since, w.Since) || !sameSecond(g.At, w.At) {
			return fmt.Sprintf("node block %d = %+v, want %+v", i+1, g, w)
		}
	}
	for i, w := range want.CRLs {
		if g := got.CRLs[i]; g.Issuer != w.Issuer || !bytes.Equal(g.DER, w.DER) {
			return fmt.Sprintf("CRL %d differs (issuer %.16s, want %.16s)", i+1, g.Issuer, w.Issuer)
		}
	}
	return ""
}

func diffRecord(g, w *keymgr.AuthorityRecord) string {
	wantKey := w.Key != nil && w.Phase != keymgr.PhaseRetired
	switch {
	case g == nil:
		return "missing"
	case g.Phase != w.Phase:
		return fmt.Sprintf("Phase = %q, want %q", g.Phase, w.Phase)
	case !certEqual(g.Root, w.Root):
		return "Root differs"
	case !certEqual(g.Cert, w.Cert):
		return "Cert differs"
	case len(g.Chain) != len(w.Chain):
		return fmt.Sprintf("%d chain certificates, want %d", len(g.Chain), len(w.Chain))
	case g.External != w.External || g.Generated != w.Generated:
		return fmt.Sprintf("External, Generated = %v, %v, want %v, %v", g.External, g.Generated, w.External, w.Generated)
	case g.Upstream != w.Upstream:
		return fmt.Sprintf("Upstream = %+v, want %+v", g.Upstream, w.Upstream)
	case (g.RootKey == nil) != (w.RootKey == nil || w.Phase == keymgr.PhaseRetired):
		return fmt.Sprintf("RootKey present = %v, want %v", g.RootKey != nil, w.RootKey != nil && w.Phase != keymgr.PhaseRetired)
	case g.RootKey != nil && !csr.SamePublicKey(g.RootKey.Public(), w.RootKey.Public()):
		return "RootKey is not the saved one"
	case wantKey && (g.Key == nil || !csr.SamePublicKey(g.Key.Public(), w.Key.Public())):
		return "Key is missing or is not the saved one"
	case !wantKey && g.Key != nil:
		return fmt.Sprintf("has a Key, want none (phase %s)", w.Phase)
	case !sameSecond(g.LatestLeafNotAfter, w.LatestLeafNotAfter):
		return fmt.Sprintf("LatestLeafNotAfter = %v, want %v", g.LatestLeafNotAfter, w.LatestLeafNotAfter)
	case g.LongestLeafTTL != w.LongestLeafTTL:
		return fmt.Sprintf("LongestLeafTTL = %v, want %v", g.LongestLeafTTL, w.LongestLeafTTL)
	case len(g.History) != len(w.History):
		return fmt.Sprintf("%d transitions, want %d", len(g.History), len(w.History))
	}
	for i, c := range w.Chain {
		if !certEqual(g.Chain[i], c) {
			return fmt.Sprintf("chain certificate %d differs", i+1)
		}
	}
	for i, t := range w.History {
		h := g.History[i]
		if h.To != t.To || h.Reason != t.Reason || h.Forced != t.Forced || !sameSecond(h.At, t.At) {
			return fmt.Sprintf("transition %d = %+v, want %+v", i+1, h, t)
		}
	}
	return ""
}

func certEqual(a, b *x509.Certificate) bool {
	return a == nil && b == nil || a != nil && b != nil && a.Equal(b)
}

// sameSecond reports whether a and b are the same instant, to the second.
func sameSecond(a, b time.Time) bool {
	if a.IsZero() || b.IsZero() {
		return a.IsZero() == b.IsZero()
	}
	d := a.Sub(b)
	return -time.Second < d && d < time.Second
}

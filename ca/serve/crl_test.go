package serve_test

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// TestAssembleCRL: with --crl and the self upstream, the elected
// replica stores a CRL for the intermediate and for the root over it,
// each signed by its CA, and /metrics shows their nextUpdate.
func TestAssembleCRL(t *testing.T) {
	c, _, audit := upstreamConfig(t, time.Hour)
	c.Backend.CRL = &serve.CRL{Validity: time.Hour, Interval: 50 * time.Millisecond}
	p := start(t, c)
	store := &dirstore.Store{Dir: c.Backend.StateDir}
	var st *keymgr.State
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if st, _, err = store.Load(t.Context()); err != nil {
			t.Fatal(err)
		}
		if len(st.CRLs) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d CRLs stored after 10s, want the intermediate's and the root's", len(st.CRLs))
		}
	}
	for _, is := range st.View().CRLIssuers() {
		rec, _ := st.View().CRL(is.ID)
		l, err := x509.ParseRevocationList(rec.DER)
		if err != nil || l.CheckSignatureFrom(is.Cert) != nil {
			t.Fatalf("the CRL of %.16s does not parse or is not signed by it: %v", is.ID, err)
		}
	}
	if n := strings.Count(string(st.View().CRLBundlePEM()), "-----BEGIN X509 CRL-----"); n != 2 {
		t.Fatalf("the CRL bundle holds %d CRLs, want 2", n)
	}
	// Each CRL stored has its audit event, written once it is stored.
	for _, rec := range st.CRLs {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			e, ok := audit.find(func(e ca.AuditEvent) bool {
				return e.Event == ca.EventCRL && e.Issuer == rec.Issuer && e.CRLNumber == rec.Number.String()
			})
			if ok && (e.Decision != ca.DecisionIssued || !e.NotAfter.Equal(rec.NextUpdate) || e.Entries != 0 || e.Reason == "" ||
				e.Source != ca.SourceAuto) {
				t.Fatalf("audit event of the CRL of %.16s: %+v, want issued, nextUpdate %v, 0 entries, why", rec.Issuer, e, rec.NextUpdate)
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no audit event for CRL %s of %.16s", rec.Number, rec.Issuer)
			}
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, metrics := get(t, "http://"+p.Addresses().Admin+"/metrics")
		if strings.Contains(metrics, `meshca_crl_issued_total{result="ok"} 2`) &&
			strings.Contains(metrics, `meshca_crl_next_update_timestamp_seconds{issuer="`+st.CRLs[0].Issuer[:16]+`"}`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks the CRLs issued and their nextUpdate:\n%s", grepLines(metrics, "meshca_crl"))
		}
	}
}

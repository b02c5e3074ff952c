package keymgrprom_test

import (
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/keymgrprom"
	"github.com/meshca/meshca/keymgr/storetest"
	"github.com/prometheus/client_golang/prometheus"
)

func TestCRLMetrics(t *testing.T) {
	now := time.Unix(1_900_000_000, 0)
	a := storetest.NewRecord(t, keymgr.PhaseActive, now)
	next := now.Add(24 * time.Hour)
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: now, NextUpdate: next}, a.Cert, a.Key)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := keymgr.NewCRLRecord(a.ID(), der)
	if err != nil {
		t.Fatal(err)
	}
	s := &keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{a}, CRLs: []keymgr.CRLRecord{rec},
		Revocations: []keymgr.Revocation{{Serial: big.NewInt(5), RevokedAt: now, NotAfter: next}},
		Blocked:     []keymgr.NodeBlock{{Node: "n1", At: now}, {Node: "n2", At: now}}}
	reg := prometheus.NewPedanticRegistry()
	m := keymgrprom.New(reg)
	m.Observe(s)
	m.CRLIssued(keymgrprom.CRLIssuedOK)
	got := gather(t, reg)
	for name, want := range map[string]float64{
		`meshca_crl_issued_total{result="error"}`:                                0,
		`meshca_crl_issued_total{result="ok"}`:                                   1,
		`meshca_crl_next_update_timestamp_seconds{issuer="` + a.ID()[:16] + `"}`: float64(next.Unix()),
		`meshca_revocations{kind="certificate"}`:                                 1,
		`meshca_revocations{kind="node"}`:                                        2,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
	// A state without CRLs drops the series of the CRLs gone.
	m.Observe(&keymgr.State{Sequence: 2, Authorities: []*keymgr.AuthorityRecord{a}})
	for name := range gather(t, reg) {
		if strings.HasPrefix(name, "meshca_crl_next_update_timestamp_seconds") {
			t.Fatalf("%s remains after the CRLs are gone", name)
		}
	}
}

// gather is every sample of reg, by name{labels}.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := mf.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

package main

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/storetest"
)

// TestRootStatusCRLs: status shows each CRL, the CAs no CRL can be
// signed for, and how much is revoked.
func TestRootStatusCRLs(t *testing.T) {
	now := time.Now()
	a := storetest.NewRecord(t, keymgr.PhaseActive, now)
	imported := storetest.NewIntermediateRecords(t, now, keymgr.PhasePrepared)[0]
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(7), ThisUpdate: now, NextUpdate: now.Add(24 * time.Hour)}, a.Cert, a.Key)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := keymgr.NewCRLRecord(a.ID(), der)
	if err != nil {
		t.Fatal(err)
	}
	st := &keymgr.State{Sequence: 2, Authorities: []*keymgr.AuthorityRecord{a, imported}, CRLs: []keymgr.CRLRecord{rec},
		Blocked: []keymgr.NodeBlock{{Node: "n", At: now}}}
	if _, err := st.Revoke([]keymgr.Revocation{{Serial: big.NewInt(3), Issuer: a.ID(), RevokedAt: now, NotAfter: now.Add(time.Hour)}}, now); err != nil {
		t.Fatal(err)
	}
	v := viewOf(st, now, keymgr.Guards{})
	var out bytes.Buffer
	if err := printStatus(&out, v, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"CRL of " + a.ID()[:16] + " (" + a.Cert.Subject.String() + "): number 7, 1 revoked, next update ",
		"no CRL can be signed for " + keymgr.Fingerprint(imported.Chain[0])[:16] + " (CN=storetest intermediate 1,O=storetest.example): meshca holds no key of it",
		"no CRL can be signed for " + imported.RootID()[:16],
		"revoked: 1 certificates not yet expired, 1 nodes blocked",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	if len(v.CRLs) != 1 || v.CRLs[0].Number != "7" || len(v.CRLProblems) != 2 {
		t.Fatalf("view %+v %q", v.CRLs, v.CRLProblems)
	}
}

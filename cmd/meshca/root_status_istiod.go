package main

import (
	"crypto/x509"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
)

// istiodView is istiod's certificate as `meshca root status
// --istiod-cert-secret` shows it: who issued it, when it expires and is
// renewed, and which roots its ca.crt holds, by the authorities of the
// state that have them.
type istiodView struct {
	Secret string `json:"secret"`
	// Error is why the Secret could not be read, or "no certificate".
	Error    string    `json:"error,omitempty"`
	Issuer   string    `json:"issuer,omitempty"`
	NotAfter time.Time `json:"notAfter,omitzero"`
	RenewAt  time.Time `json:"renewAt,omitzero"`
	DNSNames []string  `json:"dnsNames,omitempty"`
	// Authority is the id of the authority whose certificate signed it;
	// empty when none of the state's did.
	Authority string `json:"authority,omitempty"`
	// Roots are the roots ca.crt holds, each as the id of the first
	// authority of the state under it, or as its fingerprint when none is.
	Roots []string `json:"roots"`
	// Verifies says it chains to the state's bundle now, as proxies
	// verify it.
	Verifies bool `json:"verifies"`
	// Restarter is what meshca restarts istiod with when the roots grow
	// (--istiod-deployment), Loaded the roots its Pods start with, named
	// as Roots, and Restarting whether a rollout is under way.
	Restarter  string   `json:"restarter,omitempty"`
	Loaded     []string `json:"loaded,omitempty"`
	Restarting bool     `json:"restarting,omitempty"`
}

func istiodViewOf(secret string, d keymgr.Dependent, st *keymgr.State, now time.Time) *istiodView {
	v := &istiodView{Secret: secret}
	switch {
	case d.Err != nil:
		v.Error = d.Err.Error()
		return v
	case len(d.Chain) == 0:
		v.Error = "no certificate: is meshca serve --istiod-cert-secret running?"
		return v
	}
	v.Restarter, v.Restarting = d.Restarter, d.Restarting
	for _, fp := range d.Loaded {
		v.Loaded = append(v.Loaded, fingerprintName(st, fp))
	}
	leaf := d.Chain[0]
	v.Issuer, v.NotAfter, v.RenewAt, v.DNSNames = leaf.Issuer.String(), leaf.NotAfter, d.RenewAt, leaf.DNSNames
	for _, a := range st.Authorities {
		if leaf.CheckSignatureFrom(a.Cert) == nil {
			v.Authority = shortID(a)
		}
	}
	for _, r := range d.Roots {
		v.Roots = append(v.Roots, rootName(st, r))
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: certs.Pool(st.Bundle()...), Intermediates: certs.Pool(d.Chain[1:]...),
		CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	v.Verifies = err == nil
	return v
}

// rootName is the id of the first authority of st under root, or the
// root's own fingerprint, marked, when no authority is.
func rootName(st *keymgr.State, root *x509.Certificate) string {
	for _, a := range st.Authorities {
		if a.Root.Equal(root) {
			return short(a.ID())
		}
	}
	return short(keymgr.Fingerprint(root)) + " (not in the state)"
}

// fingerprintName is rootName for a root known by its fingerprint.
func fingerprintName(st *keymgr.State, fp string) string {
	for _, a := range st.Authorities {
		if keymgr.Fingerprint(a.Root) == fp {
			return short(a.ID())
		}
	}
	return short(fp) + " (not in the state)"
}

func printIstiod(w io.Writer, v *istiodView) {
	if v.Error != "" {
		fmt.Fprintf(w, "istiod's certificate (%s): %s\n", v.Secret, v.Error)
		return
	}
	by := "no authority of the state"
	if v.Authority != "" {
		by = "authority " + v.Authority
	}
	trust := "verifies against the bundle"
	if !v.Verifies {
		trust = "DOES NOT verify against the bundle: proxies refuse istiod"
	}
	fmt.Fprintf(w, "istiod's certificate (%s): %s, issued by %q (%s), not after %s, renewed at %s; %s; ca.crt holds the roots of %s\n",
		v.Secret, strings.Join(v.DNSNames, ","), v.Issuer, by, v.NotAfter.UTC().Format(time.RFC3339), v.RenewAt.UTC().Format(time.RFC3339),
		trust, strings.Join(v.Roots, ", "))
	if v.Restarter == "" {
		return
	}
	rollout := "rolled out"
	if v.Restarting {
		rollout = "a rollout is under way"
	}
	loaded := strings.Join(v.Loaded, ", ")
	if loaded == "" {
		loaded = "no roots meshca marked yet"
	}
	fmt.Fprintf(w, "istiod (%s) starts with the roots of %s (%s); it reads them only when it starts\n", v.Restarter, loaded, rollout)
}

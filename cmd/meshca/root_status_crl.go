package main

import (
	"fmt"
	"io"
	"time"

	"github.com/meshca/meshca/keymgr"
)

// crlView is one CRL of the CA state, as `meshca root status` shows it.
type crlView struct {
	Issuer     string    `json:"issuer"`
	Subject    string    `json:"subject"`
	Number     string    `json:"number"`
	Entries    int       `json:"entries"`
	ThisUpdate time.Time `json:"thisUpdate"`
	NextUpdate time.Time `json:"nextUpdate"`
}

// crlsOf fills v's CRLs, revocation counts and the CAs meshca cannot
// sign a CRL for.
func crlsOf(v *statusView, st *keymgr.State, now time.Time) {
	view := st.View()
	for _, is := range view.CRLIssuers() {
		rec, ok := view.CRL(is.ID)
		if !ok {
			continue
		}
		v.CRLs = append(v.CRLs, crlView{Issuer: short(is.ID), Subject: is.Cert.Subject.String(), Number: rec.Number.String(),
			Entries: len(view.CRLEntries(is, now)), ThisUpdate: rec.ThisUpdate, NextUpdate: rec.NextUpdate})
	}
	v.CRLProblems = view.CRLProblems()
	v.Revoked, v.BlockedNodes = len(st.Revocations), len(st.Blocked)
}

// printCRLs writes the CRL part of the status.
func printCRLs(w io.Writer, v statusView, now time.Time) {
	for _, c := range v.CRLs {
		left := "expired"
		if c.NextUpdate.After(now) {
			left = "in " + c.NextUpdate.Sub(now).Round(time.Second).String()
		}
		fmt.Fprintf(w, "CRL of %s (%s): number %s, %d revoked, next update %s (%s)\n", c.Issuer, c.Subject, c.Number, c.Entries,
			c.NextUpdate.UTC().Format(time.RFC3339), left)
	}
	for _, p := range v.CRLProblems {
		fmt.Fprintf(w, "no CRL can be signed for %s: with CRLs published, verifiers refuse what it signs, and meshca revoke refuses its certificates\n", p)
	}
	if v.Revoked > 0 || v.BlockedNodes > 0 {
		fmt.Fprintf(w, "revoked: %d certificates not yet expired, %d nodes blocked\n", v.Revoked, v.BlockedNodes)
	}
}

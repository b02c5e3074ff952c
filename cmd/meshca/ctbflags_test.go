package main

import (
	"strings"
	"testing"
)

func TestClusterTrustBundleFlags(t *testing.T) {
	tests := []struct {
		name        string
		trustDomain string
		ctb         ctbFlags
		want        string // error fragment; empty: valid
		wantSigner  string
	}{
		{name: "off"},
		{name: "unlinked", ctb: ctbFlags{publish: true}},
		{name: "linked", ctb: ctbFlags{publish: true, signer: "meshca.io/svid"}, wantSigner: "meshca.io/svid"},
		{name: "signer without publishing", ctb: ctbFlags{signer: "meshca.io/svid"},
			want: "--cluster-trust-bundle-signer-name needs --publish-cluster-trust-bundle"},
		{name: "signer without a path", ctb: ctbFlags{publish: true, signer: "meshca.io"},
			want: `--cluster-trust-bundle-signer-name: trust: signer name "meshca.io": want exactly one '/'`},
		{name: "signer with two slashes", ctb: ctbFlags{publish: true, signer: "meshca.io/a/b"},
			want: `signer name "meshca.io/a/b": want exactly one '/'`},
		{name: "signer on a one-label domain", ctb: ctbFlags{publish: true, signer: "meshca/svid"},
			want: "the domain needs at least two labels"},
		{name: "signer of Kubernetes", ctb: ctbFlags{publish: true, signer: "kubernetes.io/kube-apiserver-client"},
			want: "reserved for Kubernetes"},
		{name: "signer with capitals", ctb: ctbFlags{publish: true, signer: "Meshca.io/svid"},
			want: `domain label "Meshca"`},
		{name: "trust domain too long for a label", trustDomain: strings.Repeat("a", 64) + ".local", ctb: ctbFlags{publish: true},
			want: "--publish-cluster-trust-bundle with --trust-domain " + strings.Repeat("a", 64) + ".local: trust: ClusterTrustBundle: trust domain"},
		{name: "trust domain with an empty label", trustDomain: "a..b", ctb: ctbFlags{publish: true, signer: "meshca.io/svid"},
			want: `name suffix "a..b"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := validServeFlags()
			if tc.trustDomain != "" {
				f.trustDomain = tc.trustDomain
			}
			f.ctb = tc.ctb
			c, err := f.validate()
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("validate = %v, want an error containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Trust.ClusterTrustBundle != tc.ctb.publish || c.Trust.ClusterTrustBundleSigner != tc.wantSigner {
				t.Errorf("Trust = %+v, want publishing %v with signer %q", c.Trust, tc.ctb.publish, tc.wantSigner)
			}
		})
	}
}

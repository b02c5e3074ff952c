package main

import "testing"

func TestPodCertFlags(t *testing.T) {
	tests := []struct {
		name               string
		signer, sel, ctbSN string
		want               string
	}{
		{name: "off"},
		{name: "on", signer: "meshca.io/svid", sel: "mesh=on"},
		{name: "same bundle signer", signer: "meshca.io/svid", ctbSN: "meshca.io/svid"},
		{name: "selector without signer", sel: "mesh=on", want: "--pod-certificate-namespace-selector needs --pod-certificate-signer-name"},
		{name: "reserved signer", signer: "kubernetes.io/svid",
			want: `--pod-certificate-signer-name: trust: signer name "kubernetes.io/svid": the kubernetes.io and k8s.io domains are reserved for Kubernetes`},
		{name: "other bundle signer", signer: "meshca.io/svid", ctbSN: "meshca.io/other",
			want: "--cluster-trust-bundle-signer-name meshca.io/other must be empty or the --pod-certificate-signer-name meshca.io/svid: the Pods mount the bundle of their signer"},
		{name: "bad selector", signer: "meshca.io/svid", sel: "mesh in (",
			want: "--pod-certificate-namespace-selector: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &podCertFlags{signer: tt.signer, selector: tt.sel}
			c, err := f.config(&ctbFlags{signer: tt.ctbSN})
			switch {
			case tt.want == "" && err != nil:
				t.Fatal(err)
			case tt.want == "":
				if c.SignerName != tt.signer || c.NamespaceSelector != tt.sel {
					t.Fatalf("config %+v", c)
				}
			case err == nil || len(err.Error()) < len(tt.want) || err.Error()[:len(tt.want)] != tt.want:
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

package main

import (
	"testing"

	"github.com/spf13/pflag"
)

func TestPodCertFlags(t *testing.T) {
	tests := []struct {
		name               string
		signer, sel, ctbSN string
		backend            string // --signer; "" leaves the default (local)
		want               string
	}{
		{name: "off"},
		{name: "on", signer: "meshca.io/svid", sel: "mesh=on"},
		{name: "same bundle signer", signer: "meshca.io/svid", ctbSN: "meshca.io/svid"},
		{name: "vault backend", signer: "meshca.io/svid", backend: "vault"},
		{name: "k8scsr backend without pod certificates", backend: "k8scsr"},
		{name: "selector without signer", sel: "mesh=on", want: "--pod-certificate-namespace-selector needs --pod-certificate-signer-name"},
		{name: "reserved signer", signer: "kubernetes.io/svid",
			want: `--pod-certificate-signer-name: trust: signer name "kubernetes.io/svid": the kubernetes.io and k8s.io domains are reserved for Kubernetes`},
		{name: "other bundle signer", signer: "meshca.io/svid", ctbSN: "meshca.io/other",
			want: "--cluster-trust-bundle-signer-name meshca.io/other must be empty or the --pod-certificate-signer-name meshca.io/svid: the Pods mount the bundle of their signer"},
		{name: "bad selector", signer: "meshca.io/svid", sel: "mesh in (",
			want: "--pod-certificate-namespace-selector: "},
		{name: "k8scsr backend", signer: "meshca.io/svid", backend: "k8scsr",
			want: "--pod-certificate-signer-name cannot be used with --signer k8scsr: the kubelet's stub CSR carries no name, " +
				"the k8scsr signer hands the CSR as it is to the external signer, and the Pod's SPIFFE ID would only ride in the meshca.io/spiffe-id annotation, " +
				"which anyone who may create a CertificateSigningRequest can set; sign pod certificates with the " + podSigners() + " signer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fl := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			var b backendFlags
			registerBackend(&b, fl)
			f := &podCertFlags{}
			f.register(fl)
			args := []string{"--pod-certificate-signer-name=" + tt.signer, "--pod-certificate-namespace-selector=" + tt.sel}
			if tt.backend != "" {
				args = append(args, "--signer="+tt.backend)
			}
			if err := fl.Parse(args); err != nil {
				t.Fatal(err)
			}
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

package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestIstiodFlags(t *testing.T) {
	tests := []struct {
		name  string
		f     istiodFlags
		state string   // --state-secret
		want  []string // DNS names; nil with wantErr
		err   string
	}{
		{name: "off", f: istiodFlags{ttl: time.Hour}},
		{name: "default name", f: istiodFlags{secret: "istio-system/istiod-tls", ttl: time.Hour}, want: []string{"istiod.istio-system.svc"}},
		{name: "a revision", f: istiodFlags{secret: "mesh/istiod-tls", revision: "canary", ttl: time.Hour},
			want: []string{"istiod.mesh.svc", "istiod-canary.mesh.svc"}},
		{name: "the default revision adds nothing", f: istiodFlags{secret: "mesh/istiod-tls", revision: "default", ttl: time.Hour},
			want: []string{"istiod.mesh.svc"}},
		{name: "names given", f: istiodFlags{secret: "istio-system/istiod-tls", names: []string{"istiod.example.internal"}, ttl: time.Hour},
			want: []string{"istiod.example.internal"}},
		{name: "names without a Secret", f: istiodFlags{names: []string{"istiod.istio-system.svc"}}, err: "need --istiod-cert-secret"},
		{name: "not namespace/name", f: istiodFlags{secret: "istiod-tls", ttl: time.Hour}, err: "want namespace/name"},
		{name: "TTL over --max-ttl", f: istiodFlags{secret: "a/b", ttl: 48 * time.Hour}, err: "--istiod-cert-ttl 48h0m0s must be positive and at most --max-ttl 24h0m0s"},
		{name: "not a DNS name", f: istiodFlags{secret: "a/b", names: []string{"Istiod_1"}, ttl: time.Hour}, err: `"Istiod_1" is not a DNS name`},
		{name: "names and a revision", f: istiodFlags{secret: "a/b", names: []string{"x.y"}, revision: "r", ttl: time.Hour}, err: "not both"},
		{name: "the CA state's Secret", f: istiodFlags{secret: "istio-system/meshca-ca-state", ttl: time.Hour}, state: "istio-system/meshca-ca-state",
			err: `--istiod-cert-secret "istio-system/meshca-ca-state" is the CA state's Secret (--state-secret), which holds the CA's keys`},
		{name: "the CA state's name in another namespace", f: istiodFlags{secret: "mesh/meshca-ca-state", ttl: time.Hour}, state: "istio-system/meshca-ca-state",
			want: []string{"istiod.mesh.svc"}},
		{name: "Istio's cacerts", f: istiodFlags{secret: "istio-system/cacerts", ttl: time.Hour},
			err: `--istiod-cert-secret "istio-system/cacerts" is Istio's CA Secret cacerts, which holds a CA's private key`},
		{name: "istiod's own CA", f: istiodFlags{secret: "mesh/istio-ca-secret", ttl: time.Hour}, err: `Istio's CA Secret istio-ca-secret`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.f.config(24*time.Hour, tt.state)
			switch {
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("err = %v, want %q", err, tt.err)
			case tt.err == "" && err != nil:
				t.Fatal(err)
			case tt.err == "" && !slices.Equal(c.DNSNames, tt.want):
				t.Fatalf("names %v, want %v", c.DNSNames, tt.want)
			}
		})
	}
}

// TestServeIstiodCertSecretNames: serve refuses the CA state's Secret and
// Istio's cacerts as istiod's certificate Secret, given as flags or in the
// config file.
func TestServeIstiodCertSecretNames(t *testing.T) {
	stateFile := writeConfig(t, "stateSecret: istio-system/meshca-ca-state\nistiodCertSecret: istio-system/meshca-ca-state\ntrustLeaseNamespace: istio-system\n")
	cacertsFile := writeConfig(t, "stateDir: /tmp/x\nistiodCertSecret: istio-system/cacerts\n")
	tests := []struct {
		name string
		args []string
		err  string
	}{
		{"flags: the state's Secret", []string{"--state-secret", "istio-system/meshca-ca-state", "--istiod-cert-secret", "istio-system/meshca-ca-state"},
			`--istiod-cert-secret "istio-system/meshca-ca-state" is the CA state's Secret (--state-secret)`},
		{"flags: cacerts", []string{"--state-dir", "/tmp/x", "--istiod-cert-secret", "istio-system/cacerts"},
			`--istiod-cert-secret "istio-system/cacerts" is Istio's CA Secret cacerts`},
		{"config file: the state's Secret", []string{"--config", stateFile}, `"istio-system/meshca-ca-state" is the CA state's Secret (--state-secret)`},
		{"config file: cacerts", []string{"--config", cacertsFile}, `"istio-system/cacerts" is Istio's CA Secret cacerts`},
		{"flags: another Secret", []string{"--state-secret", "istio-system/meshca-ca-state", "--istiod-cert-secret", "istio-system/istiod-tls"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, _, err := resolveServe(t, tt.args)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.validate()
			switch {
			case tt.err == "" && err != nil:
				t.Fatal(err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("err = %v, want %q", err, tt.err)
			}
		})
	}
}

package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestIstiodFlags(t *testing.T) {
	tests := []struct {
		name string
		f    istiodFlags
		want []string // DNS names; nil with wantErr
		err  string
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.f.config(24 * time.Hour)
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

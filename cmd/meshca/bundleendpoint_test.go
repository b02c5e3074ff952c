package main

import (
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/ca/trust/bundleendpoint"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestBundleEndpointFlags: the --bundle-endpoint-* flags become the
// endpoint's configuration, and a combination that cannot serve is
// refused naming the flags at fault.
func TestBundleEndpointFlags(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "mesh-ca")
	on := func(f *serveFlags) {
		f.bundle = bundleEndpointFlags{listen: ":8443", refreshHint: bundleendpoint.DefaultRefreshHint}
	}
	vault := func(f *serveFlags) {
		f.stateDir = ""
		f.b = backendFlags{signer: "vault", trustAnchors: "r", servingCert: "c", servingKey: "k",
			opts: map[string]serveOptions{"vault": &vaultFlags{addr: "http://v", mount: "pki", role: "mesh", k8sRole: "meshca"}}}
	}
	tests := []struct {
		name   string
		mutate func(*serveFlags)
		want   serve.BundleEndpoint // checked when err is empty
		err    string
	}{
		{name: "off by default", mutate: func(*serveFlags) {}},
		{name: "https_spiffe with the default ID", mutate: on, want: serve.BundleEndpoint{Listen: ":8443", Profile: "https_spiffe",
			ID: spiffeid.RequireFromString("spiffe://cluster.local/ns/mesh-ca/sa/meshca"), RefreshHint: 5 * time.Minute}},
		{name: "https_spiffe with an ID", mutate: func(f *serveFlags) {
			on(f)
			f.bundle.id, f.bundle.refreshHint = "spiffe://cluster.local/federation/bundle", 30*time.Second
		}, want: serve.BundleEndpoint{Listen: ":8443", Profile: "https_spiffe",
			ID: spiffeid.RequireFromString("spiffe://cluster.local/federation/bundle"), RefreshHint: 30 * time.Second}},
		{name: "https_web from the certificate", mutate: func(f *serveFlags) {
			vault(f)
			on(f)
			f.bundle.certFile, f.bundle.keyFile = "/tls/tls.crt", "/tls/tls.key"
		}, want: serve.BundleEndpoint{Listen: ":8443", Profile: "https_web", CertFile: "/tls/tls.crt", KeyFile: "/tls/tls.key", RefreshHint: 5 * time.Minute}},
		{name: "settings without listen", mutate: func(f *serveFlags) { f.bundle.certFile = "/tls/tls.crt" },
			err: "need --bundle-endpoint-listen"},
		{name: "unknown profile", mutate: func(f *serveFlags) { on(f); f.bundle.profile = "https" },
			err: `--bundle-endpoint-profile "https": want https_spiffe or https_web`},
		{name: "certificate without key", mutate: func(f *serveFlags) { on(f); f.bundle.certFile = "/tls/tls.crt" },
			err: "--bundle-endpoint-cert-file and --bundle-endpoint-key-file go together"},
		{name: "https_web without certificate", mutate: func(f *serveFlags) { on(f); f.bundle.profile = "https_web" },
			err: "--bundle-endpoint-profile https_web needs --bundle-endpoint-cert-file"},
		{name: "https_web with an ID", mutate: func(f *serveFlags) {
			on(f)
			f.bundle.id, f.bundle.certFile, f.bundle.keyFile = "spiffe://cluster.local/x", "/c", "/k"
		}, err: "--bundle-endpoint-spiffe-id belongs to --bundle-endpoint-profile https_spiffe"},
		{name: "https_spiffe with a certificate", mutate: func(f *serveFlags) {
			on(f)
			f.bundle.profile, f.bundle.certFile, f.bundle.keyFile = "https_spiffe", "/c", "/k"
		}, err: "belong to --bundle-endpoint-profile https_web"},
		{name: "https_spiffe with an external signer", mutate: func(f *serveFlags) { vault(f); on(f) },
			err: "--bundle-endpoint-profile https_spiffe needs meshca's own CA key to issue the endpoint's X509-SVID, and --signer vault holds none"},
		{name: "malformed ID", mutate: func(f *serveFlags) { on(f); f.bundle.id = "https://cluster.local/x" },
			err: "--bundle-endpoint-spiffe-id: scheme is missing or invalid"},
		{name: "ID of another trust domain", mutate: func(f *serveFlags) { on(f); f.bundle.id = "spiffe://example.org/x" },
			err: "--bundle-endpoint-spiffe-id spiffe://example.org/x is not in --trust-domain cluster.local"},
		{name: "refresh hint under a second", mutate: func(f *serveFlags) { on(f); f.bundle.refreshHint = 500 * time.Millisecond },
			err: "--bundle-endpoint-refresh-hint 500ms must be at least 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := validServeFlags()
			tt.mutate(&f)
			c, err := f.validate()
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.BundleEndpoint != tt.want {
				t.Fatalf("BundleEndpoint = %+v, want %+v", c.BundleEndpoint, tt.want)
			}
		})
	}
}

// TestBundleEndpointFlagDefaults: the endpoint is off unless asked for,
// and advertises a 5-minute refresh hint.
func TestBundleEndpointFlagDefaults(t *testing.T) {
	fl := newServeCommand().Flags()
	for flag, want := range map[string]string{
		"bundle-endpoint-listen": "", "bundle-endpoint-profile": "", "bundle-endpoint-spiffe-id": "",
		"bundle-endpoint-cert-file": "", "bundle-endpoint-key-file": "", "bundle-endpoint-refresh-hint": "5m0s",
	} {
		if f := fl.Lookup(flag); f == nil || f.DefValue != want {
			t.Errorf("--%s: %+v, want default %q", flag, f, want)
		}
	}
}

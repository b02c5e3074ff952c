package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
)

// validServeFlags are flags that validate.
func validServeFlags() serveFlags {
	return serveFlags{
		stateDir: "/tmp/x", trustDomain: "cluster.local", defaultTTL: 24 * time.Hour, maxTTL: 90 * 24 * time.Hour,
		audiences: []string{"istio-ca"}, servingNames: []string{"istiod.istio-system.svc"}, keyPolicy: "ecdsa-p256",
		clusterID: "Kubernetes", nodeAccounts: []string{"istio-system/ztunnel"}, b: backendFlags{signer: "local"},
		requestTimeout: ca.DefaultRequestTimeout, maxHeaderBytes: ca.DefaultMaxHeaderBytes, maxTokenBytes: ca.DefaultMaxTokenBytes,
		maxAuthnPeer: ca.DefaultMaxAuthnPerPeer, certRenewal: true,
		prepareAt: keymgr.DefaultPrepareAt, autoInterval: keymgr.DefaultAutoRotateInterval, rotationMargin: keymgr.DefaultGuardMargin, rootLifetime: keymgr.DefaultRootTTL,
		limits: defaultLimitFlags(),
	}
}

func TestServeFlagsValidate(t *testing.T) {
	good := validServeFlags
	tests := []struct {
		name   string
		mutate func(*serveFlags)
		want   string
	}{
		{name: "valid"},
		{name: "bad trust domain", mutate: func(f *serveFlags) { f.trustDomain = "Bad Domain" }, want: "--trust-domain"},
		{name: "no CA source", mutate: func(f *serveFlags) { f.stateDir = "" }, want: "give one CA: --state-dir or --state-secret"},
		{name: "two CA sources", mutate: func(f *serveFlags) { f.caDir = "/etc/cacerts" }, want: "give one CA: --state-dir or --state-secret"},
		{name: "default above max", mutate: func(f *serveFlags) { f.defaultTTL = 100 * 24 * time.Hour }, want: "--default-ttl"},
		{name: "zero max", mutate: func(f *serveFlags) { f.maxTTL = 0 }, want: "must be positive"},
		{name: "no audiences", mutate: func(f *serveFlags) { f.audiences = nil }, want: "--token-audiences"},
		{name: "no serving names", mutate: func(f *serveFlags) { f.servingNames = nil }, want: "--serving-dns-names"},
		{name: "token limit above header limit", mutate: func(f *serveFlags) { f.maxTokenBytes = 1 << 20 }, want: "--max-token-bytes"},
		{name: "tiny header limit", mutate: func(f *serveFlags) { f.maxHeaderBytes = 100 }, want: "--max-header-bytes"},
		{name: "prepare-at out of range", mutate: func(f *serveFlags) { f.prepareAt = 1.5 }, want: "--auto-rotate-prepare-at"},
		{name: "auto-rotate interval too short", mutate: func(f *serveFlags) { f.autoInterval = time.Millisecond }, want: "--auto-rotate-interval 1ms must be between 1s and 1h"},
		{name: "auto-rotate interval too long", mutate: func(f *serveFlags) { f.autoInterval = 2 * time.Hour }, want: "--auto-rotate-interval 2h0m0s must be between 1s and 1h"},
		{name: "root shorter than leaves", mutate: func(f *serveFlags) { f.rootLifetime = time.Hour }, want: "--root-lifetime"},
		{name: "no authn budget", mutate: func(f *serveFlags) { f.maxAuthnPeer = 0 }, want: "--max-authn-per-peer"},
		{name: "renewal ttl above default", mutate: func(f *serveFlags) { f.renewalTTL = 48 * time.Hour }, want: "--cert-renewal-max-ttl"},
		{name: "bad node account", mutate: func(f *serveFlags) { f.nodeAccounts = []string{"ztunnel"} }, want: "--trusted-node-accounts"},
		{name: "remote without file", mutate: func(f *serveFlags) { f.remotes = []string{"east"} }, want: "<cluster id>=<kubeconfig file>"},
		{name: "remote named like local", mutate: func(f *serveFlags) { f.remotes = []string{"Kubernetes=/k"} }, want: "local cluster"},
		{name: "remote twice", mutate: func(f *serveFlags) { f.remotes = []string{"east=/a", "east=/b"} }, want: "given twice"},
		{name: "unknown signer", mutate: func(f *serveFlags) { f.b.signer = "hsm" }, want: `--signer (signer): "hsm"`},
		{name: "cfssl without anchors", mutate: func(f *serveFlags) {
			f.stateDir = ""
			f.b = backendFlags{signer: "cfssl", opts: map[string]serveOptions{"cfssl": &cfsslFlags{url: "http://x"}}}
		}, want: "--trust-anchors (trustAnchors) (or a CA state) is required"},
		{name: "cfssl with state dir and anchors", mutate: func(f *serveFlags) {
			f.b = backendFlags{signer: "cfssl", trustAnchors: "r", opts: map[string]serveOptions{"cfssl": &cfsslFlags{caCert: "c", caKey: "k"}}}
		}, want: "--signer cfssl: give the roots workloads trust in one way: --trust-anchors (a pinned bundle), or --state-dir or --state-secret"},
		{name: "cfssl with ca dir", mutate: func(f *serveFlags) {
			f.stateDir, f.caDir = "", "d"
			f.b = backendFlags{signer: "cfssl", trustAnchors: "r", opts: map[string]serveOptions{"cfssl": &cfsslFlags{caCert: "c", caKey: "k"}}}
		}, want: "--ca-dir belongs to the local signer, not --signer cfssl"},
		{name: "cfssl remote and local", mutate: func(f *serveFlags) {
			f.stateDir = ""
			f.b = backendFlags{signer: "cfssl", trustAnchors: "r", opts: map[string]serveOptions{"cfssl": &cfsslFlags{url: "http://x", caCert: "c", caKey: "k"}}}
		}, want: "either --cfssl-url"},
		{name: "cfssl remote without serving cert", mutate: func(f *serveFlags) {
			f.stateDir = ""
			f.b = backendFlags{signer: "cfssl", trustAnchors: "r", opts: map[string]serveOptions{"cfssl": &cfsslFlags{url: "http://x"}}}
		}, want: "are required with a remote cfssl"},
		{name: "cfssl key without cert", mutate: func(f *serveFlags) {
			f.stateDir = ""
			f.b = backendFlags{signer: "cfssl", trustAnchors: "r", opts: map[string]serveOptions{"cfssl": &cfsslFlags{caKey: "k"}}}
		}, want: "go together"},
		{name: "vault without role", mutate: func(f *serveFlags) {
			f.stateDir = ""
			f.b = backendFlags{signer: "vault", trustAnchors: "r", servingCert: "c", servingKey: "k", opts: map[string]serveOptions{"vault": &vaultFlags{addr: "http://v", mount: "pki", tokenFile: "t"}}}
		}, want: "--vault-role (vault.role) is required"},
		{name: "vault with two logins", mutate: func(f *serveFlags) {
			f.stateDir = ""
			f.b = backendFlags{signer: "vault", trustAnchors: "r", servingCert: "c", servingKey: "k",
				opts: map[string]serveOptions{"vault": &vaultFlags{addr: "http://v", mount: "pki", role: "mesh", tokenFile: "t", k8sRole: "meshca"}}}
		}, want: "log in to Vault in one way"},
		{name: "vault approle without secret", mutate: func(f *serveFlags) {
			f.stateDir = ""
			f.b = backendFlags{signer: "vault", trustAnchors: "r", servingCert: "c", servingKey: "k",
				opts: map[string]serveOptions{"vault": &vaultFlags{addr: "http://v", mount: "pki", role: "mesh", approleRoleID: "id"}}}
		}, want: "AppRole login needs"},
		{name: "vault valid", mutate: func(f *serveFlags) {
			f.stateDir = ""
			f.b = backendFlags{signer: "vault", trustAnchors: "r", servingCert: "c", servingKey: "k",
				opts: map[string]serveOptions{"vault": &vaultFlags{addr: "http://v", mount: "pki", role: "mesh", k8sRole: "meshca"}}}
		}},
		{name: "negative backdate", mutate: func(f *serveFlags) { f.backdate = -time.Second }, want: "--backdate"},
		{name: "backdate above 10m", mutate: func(f *serveFlags) { f.backdate = 11 * time.Minute }, want: "--backdate"},
		{name: "bad key policy", mutate: func(f *serveFlags) { f.keyPolicy = "dsa-1024" }, want: "--key-policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := good()
			if tt.mutate != nil {
				tt.mutate(&f)
			}
			_, err := f.validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestServeBackdate(t *testing.T) {
	tests := []struct {
		flag, want time.Duration
	}{
		{flag: certs.Backdate, want: certs.Backdate},
		{flag: time.Second, want: time.Second},
		{flag: 0, want: certs.NoBackdate},
		{flag: 10 * time.Minute, want: 10 * time.Minute},
	}
	for _, tt := range tests {
		f := validServeFlags()
		f.backdate = tt.flag
		c, err := f.validate()
		if err != nil || c.Backend.Backdate != tt.want {
			t.Errorf("--backdate %v: Backend.Backdate %v, err %v; want %v", tt.flag, c.Backend.Backdate, err, tt.want)
		}
	}
	if fl := newServeCommand().Flags().Lookup("backdate"); fl == nil || fl.DefValue != certs.Backdate.String() {
		t.Fatalf("--backdate flag %+v, want default %v", fl, certs.Backdate)
	}
}

func TestServeRemoteSecretKubeconfigAllow(t *testing.T) {
	if newServeCommand().Flags().Lookup(kube.KubeconfigAllowFlag) == nil {
		t.Fatalf("--%s is not registered", kube.KubeconfigAllowFlag)
	}
	tests := []struct {
		name  string
		allow []string
		want  string
	}{
		{name: "none"},
		{name: "all", allow: []string{"exec", "auth-provider", "tokenFile", "client-certificate", "client-key", "certificate-authority", "insecure-skip-tls-verify", "http"}},
		{name: "unknown", allow: []string{"exec", "token-file"}, want: "--remote-secret-kubeconfig-allow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := validServeFlags()
			f.secretNS, f.remoteAllow = "istio-system", tt.allow
			c, err := f.validate()
			if tt.want == "" {
				if err != nil || len(c.Clusters.KubeconfigAllow) != len(tt.allow) {
					t.Fatalf("allow %v, err %v", c.Clusters.KubeconfigAllow, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestServeValidateReturnsWhatItParsed: the node accounts, remote clusters
// and switches validate checks reach the assembly's configuration.
func TestServeValidateReturnsWhatItParsed(t *testing.T) {
	f := validServeFlags()
	f.remotes = []string{"east=/etc/east.kubeconfig"}
	f.certRenewal = false
	c, err := f.validate()
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case !c.Clusters.NodeAccounts["istio-system/ztunnel"]:
		t.Errorf("node accounts %v", c.Clusters.NodeAccounts)
	case c.Clusters.Remotes["east"] != "/etc/east.kubeconfig":
		t.Errorf("remotes %v", c.Clusters.Remotes)
	case c.CertRenewal:
		t.Error("--cert-renewal=false did not reach the configuration")
	case c.TrustDomain.Name() != "cluster.local" || c.Backend.StateDir != "/tmp/x":
		t.Errorf("config %+v", c)
	}
}

// TestServePodCertificateBundle: the Pods of the pod-certificate signer
// mount its ClusterTrustBundle, so it is published linked to that signer,
// whether or not --publish-cluster-trust-bundle was given.
func TestServePodCertificateBundle(t *testing.T) {
	for _, publish := range []bool{false, true} {
		f := validServeFlags()
		f.podCert.signer, f.ctb.publish = "meshca.io/svid", publish
		c, err := f.validate()
		if err != nil {
			t.Fatal(err)
		}
		if !c.Trust.ClusterTrustBundle || c.Trust.ClusterTrustBundleSigner != "meshca.io/svid" {
			t.Errorf("--publish-cluster-trust-bundle=%v: published %v, signer %q; want the pod-certificate signer's", publish, c.Trust.ClusterTrustBundle, c.Trust.ClusterTrustBundleSigner)
		}
	}
}

// TestServeCertSigners: --cert-signers comes from the command line, the
// config file (certSigners) or MESHCA_CERT_SIGNERS like every setting,
// reaches the assembly's configuration, and an empty name is refused (an
// empty CertSigner is always served).
func TestServeCertSigners(t *testing.T) {
	file := writeConfig(t, "certSigners: [config-a, config-b]\n")
	tests := []struct {
		name string
		args []string
		env  []string
		want []string
		err  string
	}{
		{name: "default: none"},
		{name: "flag", args: []string{"--cert-signers", "clusterA,clusterB"}, want: []string{"clusterA", "clusterB"}},
		{name: "config file", args: []string{"--config", file}, want: []string{"config-a", "config-b"}},
		{name: "environment", env: []string{"MESHCA_CERT_SIGNERS=env-a, env-b"}, want: []string{"env-a", "env-b"}},
		{name: "an empty name", args: []string{"--cert-signers", "clusterA,"}, err: "--cert-signers: a name is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, _, err := resolveServe(t, append([]string{"--state-dir", "/tmp/x"}, tt.args...), tt.env...)
			if err != nil {
				t.Fatal(err)
			}
			c, err := f.validate()
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || !slices.Equal(c.CertSigners, tt.want) {
				t.Fatalf("CertSigners %q, err %v; want %q", c.CertSigners, err, tt.want)
			}
		})
	}
}

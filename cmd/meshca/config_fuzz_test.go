package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// fuzzConfigSeeds are --config files as operators write them: the
// examples of the docs, every kind of value, and near misses; each begins
// with the header (configHeader), but for the near misses of the header.
var fuzzConfigSeeds = append(headed(fuzzConfigBodies), "", "kind: ServeConfig\nmaxTTL: 1h\n",
	"apiVersion: meshca.io/v1\nkind: ServeConfig\n", "apiVersion: meshca.io/v1alpha1\nkind: Config\n",
	"{\"apiVersion\": \"meshca.io/v1alpha1\", \"kind\": \"ServeConfig\", \"stateDir\": \"/var/lib/meshca\", \"maxInFlight\": 1e3, \"vault\": null}")

// headed is each body after the config file's header.
func headed(bodies []string) []string {
	out := make([]string, len(bodies))
	for i, b := range bodies {
		out[i] = configHeader + b
	}
	return out
}

// fuzzConfigBodies are the settings of the seeds.
var fuzzConfigBodies = []string{
	// docs/signers/vault.md
	"signer: vault\ntrustAnchors: /etc/meshca/corp-root.pem\nservingCertFile: /etc/meshca/tls/tls.crt\nservingKeyFile: /etc/meshca/tls/tls.key\n" +
		"vault:\n  addr: https://vault.vault.svc:8200\n  caFile: /etc/meshca/vault-ca.pem\n  pkiMount: pki\n  role: mesh\n  rsaRole: mesh-rsa\n  reloginBackoff: 30s\n  kubernetesRole: meshca\n",
	// docs/signers/cfssl.md, remote
	"signer: cfssl\nstateSecret: istio-system/meshca-ca\ncfssl:\n  url: https://cfssl.pki.svc:8888\n  profile: mesh\n  keyEnciphermentProfile: mesh-rsa\n  authKeyFile: /etc/cfssl/auth-key\n  tlsCAFile: /etc/cfssl/ca.pem\n",
	// The built-in CA with every kind of value.
	"stateDir: /var/lib/meshca\ntrustDomain: cluster.local\nclusterID: Kubernetes\ndefaultTTL: 24h\nmaxTTL: 2160h\nmaxInFlight: 1024\n" +
		"certRenewal: true\nautoRotatePrepareAt: 0.33\ntrustedNodeAccounts: [istio-system/ztunnel, kube-system/ztunnel]\n" +
		"servingDNSNames:\n- istiod.istio-system.svc\n- meshca.istio-system.svc\ntokenAudiences: [istio-ca]\nkeyPolicy: ecdsa-p256,rsa-2048-4096\n" +
		"remoteCluster: [east=/etc/meshca/east.kubeconfig]\nremoteSecretKubeconfigAllow: [exec]\npublishRootCertConfigmaps: false\n",
	"caDir: /etc/cacerts\nmaxTTL: null\ntrustSkipNamespaces: []\nlisten: \"\"\n",
	"{\"stateDir\": \"/var/lib/meshca\", \"maxInFlight\": 1e3, \"vault\": null}",
	"vault:\n  rsa_role: x\n",
	"defaultTTL: 86400\n",
	"maxInFlight: [1, 2]\n",
	"trustedNodeAccounts: [{a: b}]\n",
	"- stateDir\n",
	"vault.role: mesh\nvault:\n  role: other\n",
	"",
}

// FuzzConfigFile feeds `meshca serve --config` any file, through
// resolveSettings with the serve command's flags and then validate. None
// may panic. A refusal names the file. A file it accepts sets exactly the
// settings readConfigFile read from it, each marked as coming from the
// config, and written back as YAML, from those values under their config
// keys, the file reads the same.
func FuzzConfigFile(f *testing.F) {
	for _, s := range fuzzConfigSeeds {
		f.Add([]byte(s))
	}
	skip := map[string]bool{"help": true, "config": true}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "meshca.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd, sf := newServe()
		fl := cmd.Flags()
		s, err := resolveSettings(fl, []string{envName("config") + "=" + path})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--config "+path+": ") {
				t.Fatalf("refusal %q does not name the file", err)
			}
			return
		}
		read, err := readConfigFile(path, fl, skip)
		if err != nil {
			t.Fatalf("resolveSettings accepted a file readConfigFile refuses: %v", err)
		}
		for name, src := range s.source {
			if _, inFile := read[name]; inFile != (src == sourceConfig) {
				t.Fatalf("--%s comes from %s, and the file sets it: %v", name, src, inFile)
			}
		}
		doc := map[string]any{"apiVersion": ConfigAPIVersion, "kind": ConfigKind}
		for name, vals := range read {
			var v any = vals
			if !isList(fl.Lookup(name)) {
				if len(vals) != 1 {
					t.Fatalf("--%s, not a list, was set from %d values", name, len(vals))
				}
				v = vals[0]
			}
			m := doc
			keys := strings.Split(configKey(name), ".")
			for _, k := range keys[:len(keys)-1] {
				sub, ok := m[k].(map[string]any)
				if !ok {
					sub = map[string]any{}
					m[k] = sub
				}
				m = sub
			}
			m[keys[len(keys)-1]] = v
		}
		out, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		again := filepath.Join(dir, "again.yaml")
		if err := os.WriteFile(again, out, 0o600); err != nil {
			t.Fatal(err)
		}
		reread, err := readConfigFile(again, fl, skip)
		if err != nil {
			t.Fatalf("the settings read, written back as\n%s\ndo not read: %v", out, err)
		}
		if !reflect.DeepEqual(reread, read) {
			t.Fatalf("the settings %v, written back as\n%s\nread as %v", read, out, reread)
		}
		sf.settings = s
		if _, err := sf.validate(); err != nil {
			_ = s.explain(err).Error()
		}
	})
}

// FuzzConfigFileStrict: a --config file readConfigFile accepts gives each
// setting once: no key repeated in a map, no section repeated, no dotted
// key beside its section.
//
// readConfigFile once read a repeated key ("maxTTL: 1h\nmaxTTL: 2h") as
// its last value, let a repeated section replace the first one whole
// ("vault:\n  role: a\nvault:\n  addr: x" dropped vault.role), and let a
// dotted key beside its section ("vault.role: a" and "vault: {role: b}")
// win over it, all without an error. Regression seeds are in
// testdata/fuzz/FuzzConfigFileStrict.
func FuzzConfigFileStrict(f *testing.F) {
	for _, s := range fuzzConfigSeeds {
		f.Add([]byte(s))
	}
	skip := map[string]bool{"help": true, "config": true}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "meshca.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd, _ := newServe()
		if _, err := readConfigFile(path, cmd.Flags(), skip); err != nil {
			return
		}
		var doc any
		if err := yaml.UnmarshalStrict(data, &doc); err != nil {
			t.Fatalf("accepted a file with a repeated key: %v", err)
		}
		seen := map[string]bool{}
		var walk func(prefix string, m map[string]any)
		walk = func(prefix string, m map[string]any) {
			for k, v := range m {
				if sub, ok := v.(map[string]any); ok {
					walk(prefix+k+".", sub)
					continue
				}
				if seen[prefix+k] {
					t.Fatalf("accepted a file that sets %s twice", prefix+k)
				}
				seen[prefix+k] = true
			}
		}
		if m, ok := doc.(map[string]any); ok {
			walk("", m)
		}
	})
}

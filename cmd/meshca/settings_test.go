package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/serve"
	"github.com/spf13/pflag"
)

// resolveServe parses args with serve's flags and resolves the other
// settings against environ.
func resolveServe(t *testing.T, args []string, environ ...string) (*serveFlags, *settings, error) {
	t.Helper()
	cmd, f := newServe()
	if err := cmd.Flags().Parse(args); err != nil {
		t.Fatal(err)
	}
	s, err := resolveSettings(cmd.Flags(), environ)
	f.settings = s
	return f, s, err
}

// writeConfig writes a --config file of these settings, after the header.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	return writeFile(t, "meshca.yaml", configHeader+body)
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSettingsPrecedence: flag > config file > MESHCA_* > Istio's
// variable > default, for a duration and for a list, and each value's
// source is recorded.
func TestSettingsPrecedence(t *testing.T) {
	file := writeConfig(t, "maxTTL: 1000h\ntrustedNodeAccounts: [config/ztunnel]\n")
	tests := []struct {
		name      string
		args      []string
		env       []string
		maxTTL    time.Duration
		accounts  []string
		ttlSource string
		accSource string
	}{
		{name: "default", maxTTL: 90 * 24 * time.Hour, accounts: []string{"istio-system/ztunnel"}, ttlSource: "default", accSource: "default"},
		{name: "Istio's variable over the default",
			env:    []string{"MAX_WORKLOAD_CERT_TTL=720h", "CA_TRUSTED_NODE_ACCOUNTS=istio-system/ztunnel,kube-system/node-proxy"},
			maxTTL: 720 * time.Hour, accounts: []string{"istio-system/ztunnel", "kube-system/node-proxy"},
			ttlSource: "env MAX_WORKLOAD_CERT_TTL", accSource: "env CA_TRUSTED_NODE_ACCOUNTS"},
		{name: "MESHCA_ over Istio's",
			env: []string{"MAX_WORKLOAD_CERT_TTL=720h", "MESHCA_MAX_TTL=360h", "CA_TRUSTED_NODE_ACCOUNTS=a/b",
				"MESHCA_TRUSTED_NODE_ACCOUNTS=env/ztunnel, env/other"},
			maxTTL: 360 * time.Hour, accounts: []string{"env/ztunnel", "env/other"},
			ttlSource: "env MESHCA_MAX_TTL", accSource: "env MESHCA_TRUSTED_NODE_ACCOUNTS"},
		{name: "config file over the environment", args: []string{"--config", file},
			env:    []string{"MAX_WORKLOAD_CERT_TTL=720h", "MESHCA_MAX_TTL=360h", "MESHCA_TRUSTED_NODE_ACCOUNTS=env/ztunnel"},
			maxTTL: 1000 * time.Hour, accounts: []string{"config/ztunnel"}, ttlSource: "config", accSource: "config"},
		{name: "MESHCA_CONFIG names the file", env: []string{"MESHCA_CONFIG=" + file, "MESHCA_MAX_TTL=360h"},
			maxTTL: 1000 * time.Hour, accounts: []string{"config/ztunnel"}, ttlSource: "config", accSource: "config"},
		{name: "flag over everything", args: []string{"--config", file, "--max-ttl", "100h", "--trusted-node-accounts", "flag/ztunnel"},
			env:    []string{"MAX_WORKLOAD_CERT_TTL=720h", "MESHCA_MAX_TTL=360h", "CA_TRUSTED_NODE_ACCOUNTS=a/b"},
			maxTTL: 100 * time.Hour, accounts: []string{"flag/ztunnel"}, ttlSource: "flag", accSource: "flag"},
		{name: "an empty MESHCA_ variable is unset", env: []string{"MESHCA_MAX_TTL=", "MAX_WORKLOAD_CERT_TTL=720h"},
			maxTTL: 720 * time.Hour, accounts: []string{"istio-system/ztunnel"}, ttlSource: "env MAX_WORKLOAD_CERT_TTL", accSource: "default"},
		{name: "an empty Istio list is an empty list, as for istiod", env: []string{"CA_TRUSTED_NODE_ACCOUNTS=", "MAX_WORKLOAD_CERT_TTL="},
			maxTTL: 90 * 24 * time.Hour, accounts: []string{}, ttlSource: "default", accSource: "env CA_TRUSTED_NODE_ACCOUNTS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, s, err := resolveServe(t, append([]string{"--state-dir", "/tmp/x"}, tt.args...), tt.env...)
			if err != nil {
				t.Fatal(err)
			}
			if f.maxTTL != tt.maxTTL || !slices.Equal(f.nodeAccounts, tt.accounts) {
				t.Errorf("--max-ttl %v, --trusted-node-accounts %q; want %v, %q", f.maxTTL, f.nodeAccounts, tt.maxTTL, tt.accounts)
			}
			if s.source["max-ttl"] != tt.ttlSource || s.source["trusted-node-accounts"] != tt.accSource {
				t.Errorf("sources %q, %q; want %q, %q", s.source["max-ttl"], s.source["trusted-node-accounts"], tt.ttlSource, tt.accSource)
			}
			if _, err := f.validate(); err != nil {
				t.Errorf("validate: %v", err)
			}
		})
	}
}

// TestIstioVariables: each of istiod's variables reaches the setting it
// stands for, parsed as istiod parses it.
func TestIstioVariables(t *testing.T) {
	tests := []struct {
		env   string
		check func(c serve.Config) bool
	}{
		{"CA_TRUSTED_NODE_ACCOUNTS=istio-system/ztunnel,kube-system/node-proxy", func(c serve.Config) bool {
			return len(c.Clusters.NodeAccounts) == 2 && c.Clusters.NodeAccounts["kube-system/node-proxy"]
		}},
		{"TOKEN_AUDIENCES=istio-ca,meshca", func(c serve.Config) bool { return slices.Equal(c.Clusters.Audiences, []string{"istio-ca", "meshca"}) }},
		{"DEFAULT_WORKLOAD_CERT_TTL=12h", func(c serve.Config) bool { return c.DefaultTTL == 12*time.Hour }},
		{"MAX_WORKLOAD_CERT_TTL=48h", func(c serve.Config) bool { return c.MaxTTL == 48*time.Hour }},
		{"CLUSTER_ID=east", func(c serve.Config) bool { return c.Clusters.LocalID == "east" }},
		{"CITADEL_SELF_SIGNED_CA_CERT_TTL=87600h", func(c serve.Config) bool { return c.Backend.State.RootTTL == 87600*time.Hour }},
		{"TRUST_DOMAIN=example.org", func(c serve.Config) bool { return c.TrustDomain.Name() == "example.org" }},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			f, _, err := resolveServe(t, []string{"--state-dir", "/tmp/x"}, tt.env)
			if err != nil {
				t.Fatal(err)
			}
			c, err := f.validate()
			if err != nil || !tt.check(c) {
				t.Fatalf("config %+v, err %v", c, err)
			}
		})
	}
	t.Run("ROOT_CA_DIR", func(t *testing.T) {
		f, _, err := resolveServe(t, nil, "ROOT_CA_DIR=/etc/cacerts")
		if err != nil {
			t.Fatal(err)
		}
		if c, err := f.validate(); err != nil || c.Backend.CADir != "/etc/cacerts" {
			t.Fatalf("CADir %q, err %v", c.Backend.CADir, err)
		}
	})
}

// TestSettingsErrors: a value that does not parse, or that validation
// refuses, is an error naming the variable or config key it came from.
func TestSettingsErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		file string
		want string
	}{
		{name: "Istio duration", env: []string{"DEFAULT_WORKLOAD_CERT_TTL=1d"},
			want: `DEFAULT_WORKLOAD_CERT_TTL="1d" (Istio's variable, taken for --default-ttl): time: unknown unit "d" in duration "1d"`},
		{name: "Istio root lifetime", env: []string{"CITADEL_SELF_SIGNED_CA_CERT_TTL=10y"},
			want: `CITADEL_SELF_SIGNED_CA_CERT_TTL="10y" (Istio's variable, taken for --root-lifetime)`},
		{name: "Istio node account", env: []string{"CA_TRUSTED_NODE_ACCOUNTS=istio-system/ztunnel,ztunnel"},
			want: `--trusted-node-accounts: node account "ztunnel" is not namespace/serviceaccount (--trusted-node-accounts from env CA_TRUSTED_NODE_ACCOUNTS)`},
		{name: "Istio empty audiences", env: []string{"TOKEN_AUDIENCES="},
			want: "--token-audiences must name at least one audience (--token-audiences from env TOKEN_AUDIENCES)"},
		{name: "Istio default above max", env: []string{"DEFAULT_WORKLOAD_CERT_TTL=48h", "MAX_WORKLOAD_CERT_TTL=24h"},
			want: "--default-ttl 48h0m0s is above --max-ttl 24h0m0s (--default-ttl from env DEFAULT_WORKLOAD_CERT_TTL; --max-ttl from env MAX_WORKLOAD_CERT_TTL)"},
		{name: "ROOT_CA_DIR and a state", env: []string{"ROOT_CA_DIR=/etc/cacerts"},
			want: "give one CA: --state-dir or --state-secret (meshca's own state), or --ca-dir (a plugged-in CA) (--ca-dir from env ROOT_CA_DIR)"},
		{name: "Istio trust domain", env: []string{"TRUST_DOMAIN=Not A Domain"}, want: "(--trust-domain from env TRUST_DOMAIN)"},
		{name: "MESHCA_ integer", env: []string{"MESHCA_MAX_IN_FLIGHT=many"},
			want: `MESHCA_MAX_IN_FLIGHT="many": --max-in-flight: strconv.ParseInt: parsing "many": invalid syntax`},
		{name: "MESHCA_ bool", env: []string{"MESHCA_CERT_RENEWAL=maybe"}, want: `MESHCA_CERT_RENEWAL="maybe": --cert-renewal`},
		{name: "config duration", file: "defaultTTL: 86400\n",
			want: `--default-ttl (defaultTTL): "86400": time: missing unit in duration "86400"`},
		{name: "config list for a single value", file: "trustDomain: [a.org, b.org]\n",
			want: `--trust-domain (trustDomain): "a.org,b.org": takes one value, not a list of 2`},
		{name: "config unknown key", file: "trustDomian: example.org\n", want: `unknown field "trustDomian"`},
		{name: "config unknown backend key", file: "vault:\n  rsa_role: x\n", want: `unknown field "vault.rsa_role"`},
		{name: "config secret value", file: "cfssl:\n  authKey: 0123\n", want: `unknown field "cfssl.authKey"`},
		{name: "config map value", file: "listen:\n  port: 1\n", want: `unknown field "listen.port"`},
		{name: "config refused by validation", file: "clusterID: \"\"\n", want: "--cluster-id must not be empty (--cluster-id from config clusterID)"},
		{name: "missing config", args: []string{"--config", "/nonexistent/meshca.yaml"}, want: "--config: open /nonexistent/meshca.yaml: no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--state-dir", "/tmp/x"}, tt.args...)
			if tt.file != "" {
				args = append(args, "--config", writeConfig(t, tt.file))
			}
			f, s, err := resolveServe(t, args, tt.env...)
			if err == nil {
				_, err = f.validate()
				err = s.explain(err)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v\nwant %q", err, tt.want)
			}
		})
	}
}

// TestConfigFileKeys: every serve flag has a config key, camelCase with
// initialisms, the backends' in their sections; the values of a file
// reach the flags.
func TestConfigFileKeys(t *testing.T) {
	keys := map[string]string{
		"trust-domain": "trustDomain", "default-ttl": "defaultTTL", "serving-dns-names": "servingDNSNames", "cluster-id": "clusterID",
		"ca-dir": "caDir", "bundle-endpoint-spiffe-id": "bundleEndpointSPIFFEID", "cert-renewal-max-ttl": "certRenewalMaxTTL",
		"audit-log-file": "auditLogFile", "cfssl-url": "cfssl.url", "vault-approle-role-id": "vault.appRoleRoleID",
	}
	for flag, want := range keys {
		if got := configKey(flag); got != want {
			t.Errorf("configKey(%q) = %q, want %q", flag, got, want)
		}
	}
	cmd, _ := newServe()
	seen := map[string]string{}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		k := configKey(f.Name)
		if other, dup := seen[k]; dup {
			t.Errorf("--%s and --%s share the config key %q", f.Name, other, k)
		}
		seen[k] = f.Name
		if e := envName(f.Name); slices.Contains(notSettings, e) {
			t.Errorf("--%s's variable %s is one meshca reads as a secret", f.Name, e)
		}
	})
	file := writeConfig(t, `
stateDir: /var/lib/meshca
trustDomain: example.org
servingDNSNames: [meshca.istio-system.svc, istiod.istio-system.svc]
maxInFlight: 16
certRenewal: false
autoRotatePrepareAt: 0.25
remoteCluster: [east=/etc/east, west=/etc/west]
logLevel: debug
signer: local
vault:
  reloginBackoff: 2m
tokenAudiences: ~
`)
	f, s, err := resolveServe(t, []string{"--config", file})
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case f.stateDir != "/var/lib/meshca" || f.trustDomain != "example.org" || f.maxInFlight != 16 || f.certRenewal || f.prepareAt != 0.25:
		t.Errorf("scalars: %+v", f)
	case !slices.Equal(f.servingNames, []string{"meshca.istio-system.svc", "istiod.istio-system.svc"}) || len(f.remotes) != 2:
		t.Errorf("lists: %q %q", f.servingNames, f.remotes)
	case f.log.level != "debug" || f.b.opts["vault"].(*vaultFlags).reloginBackoff != 2*time.Minute:
		t.Errorf("log level %q, backoff %v", f.log.level, f.b.opts["vault"].(*vaultFlags).reloginBackoff)
	case s.source["token-audiences"] != sourceDefault || s.source["trust-domain"] != sourceConfig || s.configFile != file:
		t.Errorf("sources %v, file %q", s.source, s.configFile)
	}
}

// TestIgnoredEnvironment: MESHCA_ variables that name no setting are
// reported, except secrets meshca reads and Kubernetes' Service links.
func TestIgnoredEnvironment(t *testing.T) {
	_, s, err := resolveServe(t, nil, "MESHCA_TRUST_DOMAN=typo.org", "MESHCA_SERVICE_HOST=10.0.0.1", "MESHCA_PORT_15012_TCP=tcp://10.0.0.1:15012",
		"MESHCA_VAULT_SECRET_ID=s3cr3t", "MESHCA_CFSSL_AUTH_KEY=00ff", "MESHCA_CACHE=/tmp/c", "PATH=/bin")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.ignoredEnv, []string{"MESHCA_TRUST_DOMAN"}) {
		t.Fatalf("ignored %q", s.ignoredEnv)
	}
}

package main

import (
	"slices"
	"strings"
	"testing"
)

// TestServeNodeProxyDeny: --node-proxy-deny comes from the command line,
// the config file (nodeProxyDeny) or MESHCA_NODE_PROXY_DENY like every
// setting and reaches the clusters' configuration; by default it denies
// kube-system and istiod's account of every revision; an entry that is
// neither a namespace, namespace/serviceaccount nor namespace/prefix* is
// refused, naming where it came from.
func TestServeNodeProxyDeny(t *testing.T) {
	file := writeFile(t, "meshca.yaml", configHeader+"nodeProxyDeny: [mesh, istio-system/istiod-canary]\n")
	tests := []struct {
		name string
		args []string
		env  []string
		want []string
		err  string
	}{
		{name: "default", want: []string{"istio-system/istiod", "istio-system/istiod-*", "kube-system"}},
		{name: "a prefix", args: []string{"--node-proxy-deny", "kube-system,mesh/istiod-*"}, want: []string{"kube-system", "mesh/istiod-*"}},
		{name: "a prefix of nothing", args: []string{"--node-proxy-deny", "mesh/*"}, err: `--node-proxy-deny: entry "mesh/*": a namespace alone, "mesh", denies every account of it`},
		{name: "flag", args: []string{"--node-proxy-deny", "kube-system,mesh/meshca"}, want: []string{"kube-system", "mesh/meshca"}},
		{name: "flag, empty: none denied", args: []string{"--node-proxy-deny="}, want: []string{}},
		{name: "config file", args: []string{"--config", file}, want: []string{"istio-system/istiod-canary", "mesh"}},
		{name: "environment", env: []string{"MESHCA_NODE_PROXY_DENY=kube-system, ops/vault"}, want: []string{"kube-system", "ops/vault"}},
		{name: "not a namespace", args: []string{"--node-proxy-deny", "Kube-System"}, err: `--node-proxy-deny: entry "Kube-System" is neither a namespace nor namespace/serviceaccount`},
		{name: "bad entry from the environment", env: []string{"MESHCA_NODE_PROXY_DENY=a/b/c"},
			err: "(--node-proxy-deny from env MESHCA_NODE_PROXY_DENY)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, s, err := resolveServe(t, append([]string{"--state-dir", "/tmp/x"}, tt.args...), tt.env...)
			if err != nil {
				t.Fatal(err)
			}
			c, err := f.validate()
			if tt.err != "" {
				if err = s.explain(err); err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			got := c.Clusters.NodeProxyDeny.Entries()
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("NodeProxyDeny %q, err %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestServeAdminBindAddress: --admin-bind-address binds the admin
// listener to one IP address (the chart passes the Pod's), on the port of
// --admin-listen, which must then give the port alone.
func TestServeAdminBindAddress(t *testing.T) {
	tests := []struct {
		name         string
		listen, bind string
		want, err    string
	}{
		{name: "default: every interface", listen: ":15014", want: ":15014"},
		{name: "an address in --admin-listen alone", listen: "127.0.0.1:15014", want: "127.0.0.1:15014"},
		{name: "IPv4 Pod IP", listen: ":15014", bind: "10.244.1.7", want: "10.244.1.7:15014"},
		{name: "IPv6 Pod IP, without brackets", listen: ":15014", bind: "fd00:10:244::7", want: "[fd00:10:244::7]:15014"},
		{name: "kernel-picked port", listen: ":0", bind: "127.0.0.2", want: "127.0.0.2:0"},
		{name: "two addresses", listen: "127.0.0.1:15014", bind: "10.244.1.7", err: `--admin-listen "127.0.0.1:15014" must then be a port alone`},
		{name: "admin listener off", listen: "", bind: "10.244.1.7", err: "must then be a port alone"},
		{name: "a host name", listen: ":15014", bind: "meshca.example", err: `--admin-bind-address "meshca.example" is not an IP address`},
		{name: "bracketed", listen: ":15014", bind: "[fd00::7]", err: "is not an IP address"},
		{name: "a zone", listen: ":15014", bind: "fe80::1%eth0", err: "is not an IP address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := validServeFlags()
			f.adminListen, f.adminBind = tt.listen, tt.bind
			c, err := f.validate()
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || c.AdminListen != tt.want {
				t.Fatalf("AdminListen %q, err %v; want %q", c.AdminListen, err, tt.want)
			}
		})
	}
	f, _, err := resolveServe(t, []string{"--state-dir", "/tmp/x"}, "MESHCA_ADMIN_BIND_ADDRESS=10.244.1.7")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := f.validate(); err != nil || c.AdminListen != "10.244.1.7:15014" {
		t.Fatalf("from MESHCA_ADMIN_BIND_ADDRESS: AdminListen %q, %v", c.AdminListen, err)
	}
}

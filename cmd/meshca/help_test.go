package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// helpOf runs meshca with args and returns what it wrote.
func helpOf(t *testing.T, args ...string) string {
	t.Helper()
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		t.Fatalf("meshca %v: %v", args, err)
	}
	return out.String()
}

func TestServeFlagGroups(t *testing.T) {
	cmd, f := newServe()
	groups := map[string]int{}
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		g := flagGroupOf(fl)
		if g == "" && fl.Name != "help" {
			t.Errorf("--%s is in no group of serve's help: register it in a block of serveFlags.groups", fl.Name)
		}
		groups[g]++
	})
	for _, g := range f.groups(cmd) {
		if groups[g.title] == 0 {
			t.Errorf("group %q has no flag", g.title)
		}
		for _, k := range g.key {
			fl := cmd.Flags().Lookup(k)
			if fl == nil || flagGroupOf(fl) != g.title {
				t.Errorf("group %q names --%s, which is not one of its flags", g.title, k)
			}
		}
	}
}

func TestServeHelp(t *testing.T) {
	short := helpOf(t, "serve", "--help")
	if n := strings.Count(short, "\n"); n > 40 {
		t.Errorf("meshca serve --help is %d lines, more than a screen:\n%s", n, short)
	}
	if !strings.Contains(short, `"meshca serve --help=all"`) {
		t.Errorf("meshca serve --help does not name the full list:\n%s", short)
	}
	all := helpOf(t, "serve", "--help=all")
	cmd, f := newServe()
	for _, g := range f.groups(cmd) {
		if !strings.Contains(all, "\n"+g.title+":\n") {
			t.Errorf("meshca serve --help=all has no group %q", g.title)
		}
	}
	listed := map[string]int{}
	for _, line := range strings.Split(all, "\n") {
		// A flag's line; its wrapped usage is indented further.
		line, ok := strings.CutPrefix(line, "      --")
		if !ok {
			line, ok = strings.CutPrefix(line, "  -h, --")
		}
		if name, _, _ := strings.Cut(line, " "); ok {
			listed["--"+name]++
		}
	}
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		if n := listed["--"+fl.Name]; n != 1 {
			t.Errorf("meshca serve --help=all lists --%s %d times, want once", fl.Name, n)
		}
	})
	if got := helpOf(t, "help", "serve"); got != short {
		t.Errorf("meshca help serve differs from meshca serve --help:\n%s", got)
	}
}

// TestFlagPlaceholders: pflag takes a back-quoted word of a usage string
// as the flag's argument name, so that `meshca root` in a usage would
// show as "--state-dir meshca root".
func TestFlagPlaceholders(t *testing.T) {
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(fl *pflag.Flag) {
			if name, _ := pflag.UnquoteUsage(fl); strings.Contains(name, " ") || strings.Contains(name, "meshca") {
				t.Errorf("%s --%s: its help shows the argument name %q, back-quoted in its usage", c.CommandPath(), fl.Name, name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCommand())
}

// TestRootStepFlags: each step shows the flags that apply to it alone.
func TestRootStepFlags(t *testing.T) {
	common := []string{"audit-log-file", "context", "help", "kubeconfig", "max-ttl", "reason", "signer", "state-dir", "state-secret",
		"vault-addr", "vault-approle-mount", "vault-approle-role-id", "vault-approle-secret-id-file", "vault-ca-file",
		"vault-kubernetes-mount", "vault-kubernetes-role", "vault-kubernetes-token-file", "vault-pki-mount", "vault-token-file"}
	step := []string{"force", "istiod-cert-secret", "margin"}
	want := map[string][]string{
		"activate": append(slices.Concat(common, step), "cfssl-label", "cfssl-profile", "cfssl-tls-ca-file", "cfssl-url", "vault-role", "vault-rsa-role"),
		"retire": append(slices.Concat(common, step), "vault-keep-issuer", "vault-root-mount", "destroy-root-key", "upstream", "vault-pki-issuer",
			"vault-transit-key", "vault-transit-mount", "pkcs11-module", "pkcs11-pin-file", "pkcs11-slot", "pkcs11-token-label"),
		"prepare": append(slices.Clone(common), "ca-dir", "cert", "chain", "external", "issued-ttl", "key", "key-type", "lifetime",
			"root", "trust-domain", "vault-issuer-type", "vault-root-mount", "upstream", "intermediate-ttl", "vault-pki-issuer", "vault-transit-key", "vault-transit-mount",
			"pkcs11-module", "pkcs11-pin-file", "pkcs11-slot", "pkcs11-token-label"),
	}
	root, _, err := newRootCommand().Find([]string{"root"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range root.Commands() {
		w, ok := want[sub.Name()]
		if !ok {
			continue
		}
		sub.InitDefaultHelpFlag()
		var got []string
		sub.Flags().VisitAll(func(fl *pflag.Flag) { got = append(got, fl.Name) })
		slices.Sort(w)
		slices.Sort(got)
		if !slices.Equal(got, w) {
			t.Errorf("meshca root %s flags:\n got %v\nwant %v", sub.Name(), got, w)
		}
		delete(want, sub.Name())
	}
	if len(want) != 0 {
		t.Errorf("no root commands %v", want)
	}
}

package main

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// configHeader begins every config file of the tests.
const configHeader = "apiVersion: " + ConfigAPIVersion + "\nkind: " + ConfigKind + "\n"

// TestConfigFileRepeats: a --config file that gives a setting twice is
// refused with an error naming the setting (and, from the YAML library,
// the line of its second value); a setting given once, dotted or in its
// section, is read.
func TestConfigFileRepeats(t *testing.T) {
	tests := []struct {
		name string
		file string
		want string              // the error after "--config <path>: "
		read map[string][]string // what an accepted file gives
	}{
		{name: "key twice", file: configHeader + "stateDir: /var/lib/meshca\nmaxTTL: 1h\nmaxTTL: 2160h\n",
			want: `line 5: key "maxTTL" already set in map`},
		{name: "key twice, once null", file: configHeader + "maxTTL: null\nmaxTTL: 1h\n",
			want: `line 4: key "maxTTL" already set in map`},
		{name: "list twice", file: configHeader + "tokenAudiences: [istio-ca]\ntokenAudiences: [meshca]\n",
			want: `line 4: key "tokenAudiences" already set in map`},
		{name: "key twice in a section", file: configHeader + "vault:\n  role: mesh\n  addr: https://vault:8200\n  role: other\n",
			want: `line 6: key "role" already set in map`},
		// yaml.v2 gives the line of the second value: the section's
		// first key, below its name.
		{name: "section twice", file: configHeader + "signer: vault\nvault:\n  role: mesh\nvault:\n  addr: https://vault:8200\n",
			want: `line 7: key "vault" already set in map`},
		{name: "section twice, flow style", file: configHeader + "vault: {role: mesh}\nvault: {addr: https://vault:8200}\n",
			want: `line 4: key "vault" already set in map`},
		{name: "JSON key twice", file: `{"apiVersion": "meshca.io/v1alpha1", "kind": "ServeConfig", "maxTTL": "1h", "maxTTL": "2h"}`,
			want: `line 1: key "maxTTL" already set in map`},
		{name: "key beside a merge that sets it", file: configHeader + "<<: {maxTTL: 1h}\nmaxTTL: 2h\n",
			want: `line 4: key "maxTTL" already set in map`},
		{name: "two repeats", file: configHeader + "maxTTL: 1h\nmaxTTL: 2h\ndefaultTTL: 1h\ndefaultTTL: 2h\n",
			want: `line 4: key "maxTTL" already set in map; line 6: key "defaultTTL" already set in map`},
		{name: "dotted key beside its section", file: configHeader + "vault.role: mesh\nvault:\n  role: other\n",
			want: `vault.role is set twice: by the key "role" of section "vault" and by the key "vault.role"`},
		{name: "dotted null beside its section", file: configHeader + "vault:\n  role: other\nvault.role: null\n",
			want: `vault.role is set twice: by the key "role" of section "vault" and by the key "vault.role"`},

		{name: "dotted key", file: configHeader + "vault.role: mesh\n", read: map[string][]string{"vault-role": {"mesh"}}},
		{name: "dotted key beside other keys of its section", file: configHeader + "vault.role: mesh\nvault:\n  addr: https://vault:8200\n",
			read: map[string][]string{"vault-role": {"mesh"}, "vault-addr": {"https://vault:8200"}}},
		{name: "a merge", file: configHeader + "<<: {maxTTL: 1h}\ndefaultTTL: 30m\n",
			read: map[string][]string{"max-ttl": {"1h"}, "default-ttl": {"30m"}}},
		{name: "a value repeated in a list", file: configHeader + "tokenAudiences: [istio-ca, istio-ca]\n",
			read: map[string][]string{"token-audiences": {"istio-ca", "istio-ca"}}},
		{name: "the same name in two sections", file: configHeader + "vault:\n  caFile: /v.pem\ncfssl:\n  tlsCAFile: /c.pem\n",
			read: map[string][]string{"vault-ca-file": {"/v.pem"}, "cfssl-tls-ca-file": {"/c.pem"}}},
		{name: "a second document", file: configHeader + "maxTTL: 1h\n---\nmaxTTL: 2h\n", want: "line 4: a second YAML document; put every setting in one"},
		{name: "a second document after a comment", file: "# meshca\n---\n" + configHeader + "maxTTL: 1h\n--- # more\ndefaultTTL: 1h\n",
			want: "line 6: a second YAML document; put every setting in one"},
		{name: "a document end", file: configHeader + "maxTTL: 1h\n...\n", want: "line 4: a second YAML document; put every setting in one"},
		{name: "an explicit first document", file: "# meshca\n---\n" + configHeader + "maxTTL: 1h\n", read: map[string][]string{"max-ttl": {"1h"}}},
		{name: "dashes inside a value", file: configHeader + "trustDomain: |\n  ---\n", read: map[string][]string{"trust-domain": {"---\n"}}},
		{name: "no apiVersion", file: "kind: ServeConfig\nmaxTTL: 1h\n",
			want: `no apiVersion: a config file begins with "apiVersion: meshca.io/v1alpha1" and "kind: ServeConfig"`},
		{name: "no header at all", file: "maxTTL: 1h\n",
			want: `no apiVersion: a config file begins with "apiVersion: meshca.io/v1alpha1" and "kind: ServeConfig"`},
		{name: "another version", file: "apiVersion: meshca.io/v1\nkind: ServeConfig\n",
			want: `apiVersion "meshca.io/v1" is not one this meshca reads: want "meshca.io/v1alpha1"`},
		{name: "another kind", file: "apiVersion: meshca.io/v1alpha1\nkind: Config\n",
			want: `kind "Config" is not one this meshca reads: want "ServeConfig"`},
		{name: "no kind", file: "apiVersion: meshca.io/v1alpha1\n",
			want: `no kind: a config file begins with "apiVersion: meshca.io/v1alpha1" and "kind: ServeConfig"`},
		{name: "empty", file: "",
			want: `want a map of settings beginning with apiVersion: meshca.io/v1alpha1 and kind: ServeConfig, not null`},
		{name: "a list", file: "- listen\n",
			want: `want a map of settings beginning with apiVersion: meshca.io/v1alpha1 and kind: ServeConfig, not a list`},
		{name: "the header alone", file: configHeader, read: map[string][]string{}},
		{name: "dashes starting a key", file: configHeader + "maxTTL: 1h\n---x: 1\n", want: `unknown field "---x"`},
	}
	skip := map[string]bool{"help": true, "config": true}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "meshca.yaml")
			if err := os.WriteFile(path, []byte(tt.file), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd, _ := newServe()
			read, err := readConfigFile(path, cmd.Flags(), skip)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !maps.EqualFunc(read, tt.read, slices.Equal[[]string]) {
					t.Fatalf("read %v, want %v", read, tt.read)
				}
				return
			}
			if want := "--config " + path + ": " + tt.want; err == nil || err.Error() != want {
				t.Fatalf("err = %v\nwant    %s", err, want)
			}
		})
	}
}

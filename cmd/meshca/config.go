package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// The --config file of serve is a YAML map, apiVersion meshca.io/v1alpha1
// and kind ServeConfig, then one key per flag: the
// flag's name in camelCase (--trust-domain is trustDomain, --default-ttl
// defaultTTL, --serving-dns-names servingDNSNames), and the backends'
// flags in one section per backend (--cfssl-url is cfssl.url, --vault-role
// vault.role, --k8scsr-signer-name k8scsr.signerName;
// docs/signers/). Lists are YAML lists, durations strings
// such as "24h". Unknown keys are errors, and so is a setting given twice:
// a key repeated in a map, a section repeated, or a section's key also
// written dotted at the top ("vault.role: a" and "vault: {role: b}").
// Secrets are never values here: only paths of files holding them (or
// environment variables).

// backendShared are the flags every signer backend shares, and those of
// the upstream of the intermediate: named in errors with their config
// file key, as the backends' and upstreams' own flags are.
var backendShared = map[string]bool{"signer": true, "trust-anchors": true, "serving-cert-file": true, "serving-key-file": true,
	"upstream": true, "intermediate-ttl": true, "intermediate-renew-at": true}

// initialisms are written in capitals in config keys, as in Go names.
var initialisms = map[string]string{"id": "ID", "ttl": "TTL", "dns": "DNS", "ca": "CA", "url": "URL", "tls": "TLS", "spiffe": "SPIFFE", "rsa": "RSA", "pki": "PKI"}

// compounds are words written as two in config keys.
var compounds = map[string]string{"approle": "appRole"}

// configKey is the config file key of a flag: a signer backend's flag
// (<backend>-...) in the backend's section, the rest of its name in
// camelCase (--vault-approle-role-id is vault.appRoleRoleID); another
// flag its name in camelCase.
func configKey(flag string) string {
	if section, rest, ok := flagSection(flag); ok {
		return section + "." + camel(rest)
	}
	return camel(flag)
}

// flagSection is the config file section of flag, an upstream's (one it
// registers: --vault-transit-key is the vault-transit upstream's, not the
// vault signer's) or a signer backend's, and the rest of its name.
func flagSection(flag string) (section, rest string, ok bool) {
	if section, rest, ok := upstreamSection(flag); ok {
		return section, rest, true
	}
	return signerSection(flag)
}

// camel writes a flag's name in camelCase, initialisms in capitals.
func camel(flag string) string {
	words := strings.Split(flag, "-")
	for i, w := range words {
		if c, ok := compounds[w]; ok {
			w = c
		}
		switch up, ok := initialisms[w]; {
		case i == 0:
			words[i] = w
		case ok:
			words[i] = up
		case w != "":
			words[i] = strings.ToUpper(w[:1]) + w[1:]
		}
	}
	return strings.Join(words, "")
}

// name renders a setting for an error: "--cfssl-url (cfssl.url)".
func name(flag string) string {
	if _, _, ok := flagSection(flag); ok || backendShared[flag] {
		return "--" + flag + " (" + configKey(flag) + ")"
	}
	return "--" + flag
}

// readConfigFile reads path and returns the values it gives, by flag
// name, for the flags of fl except skip: one string per scalar, one per
// element of a list. A key set to null is left out. It refuses a setting
// given twice: YAMLToJSONStrict (yaml.v2's strict mode) refuses a key
// repeated in one map, merged ones ("<<") included, naming the key and
// the line of its second value; flatten refuses a dotted key beside its
// section.
func readConfigFile(path string, fl *pflag.FlagSet, skip map[string]bool) (map[string][]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	if line := secondDocument(data); line > 0 {
		return nil, fmt.Errorf("--config %s: line %d: a second YAML document; put every setting in one", path, line)
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("--config %s: %s", path, yamlError(err))
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("--config %s: want a map of settings beginning with apiVersion: %s and kind: %s, not %s",
			path, ConfigAPIVersion, ConfigKind, jsonKind(doc))
	}
	if err := checkHeader(top); err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	flags := map[string]string{} // config key -> flag
	fl.VisitAll(func(f *pflag.Flag) {
		if !skip[f.Name] {
			flags[configKey(f.Name)] = f.Name
		}
	})
	out := map[string][]string{}
	if err := flatten("", top, flags, map[string]string{}, out); err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	return out, nil
}

// The config file's version and kind: a file without them, or of another
// version, is refused, so that a later meshca can change a key's meaning
// under a new version without reading an old file wrongly.
const (
	ConfigAPIVersion = "meshca.io/v1alpha1"
	ConfigKind       = "ServeConfig"
)

// checkHeader checks the file's apiVersion and kind and removes them from
// top, which then holds only settings.
func checkHeader(top map[string]any) error {
	for _, h := range []struct{ key, want string }{{"apiVersion", ConfigAPIVersion}, {"kind", ConfigKind}} {
		v, ok := top[h.key]
		switch {
		case !ok:
			return fmt.Errorf("no %s: a config file begins with \"apiVersion: %s\" and \"kind: %s\"", h.key, ConfigAPIVersion, ConfigKind)
		case v != h.want:
			return fmt.Errorf("%s %q is not one this meshca reads: want %q", h.key, fmt.Sprint(v), h.want)
		}
		delete(top, h.key)
	}
	return nil
}

// yamlError renders an error of the YAML library on one line: yaml.v2
// lists the errors of a document, "line 3: key \"maxTTL\" already set in
// map" for a repeated key, one a line under "yaml: unmarshal errors:".
func yamlError(err error) string {
	msg, found := strings.CutPrefix(err.Error(), "yaml: unmarshal errors:\n")
	if !found {
		return err.Error()
	}
	lines := strings.Split(msg, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.Join(lines, "; ")
}

// flatten walks m, whose keys are prefixed with prefix, into out. seen
// records where each key was set, for a key set twice: once dotted at the
// top and once in its section.
func flatten(prefix string, m map[string]any, flags, seen map[string]string, out map[string][]string) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		key := prefix + k
		v := m[k]
		if sub, ok := v.(map[string]any); ok {
			if err := flatten(key+".", sub, flags, seen, out); err != nil {
				return err
			}
			continue
		}
		flag, ok := flags[key]
		if !ok {
			return fmt.Errorf("unknown field %q", key)
		}
		where := fmt.Sprintf("the key %q", k)
		if prefix != "" {
			where += fmt.Sprintf(" of section %q", strings.TrimSuffix(prefix, "."))
		}
		if first, dup := seen[key]; dup {
			return fmt.Errorf("%s is set twice: by %s and by %s", key, first, where)
		}
		seen[key] = where
		if v == nil {
			continue
		}
		vals, err := scalars(v)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		out[flag] = vals
	}
	return nil
}

// scalars renders a YAML scalar, or a list of them, as flag values.
func scalars(v any) ([]string, error) {
	switch v := v.(type) {
	case string:
		return []string{v}, nil
	case json.Number:
		return []string{v.String()}, nil
	case bool:
		return []string{fmt.Sprint(v)}, nil
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			s, err := scalars(e)
			if err != nil || len(s) != 1 {
				return nil, fmt.Errorf("a list holds only strings, numbers and booleans, not %s", jsonKind(e))
			}
			out = append(out, s[0])
		}
		return out, nil
	}
	return nil, fmt.Errorf("want a string, number, boolean or list, not %s", jsonKind(v))
}

func jsonKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "a map"
	case []any:
		return "a list"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// secondDocument returns the line (from 1) of a document marker that
// ends the file's first YAML document, or 0. The YAML reader reads the
// first document only: the settings of any other would be dropped
// without a word. A marker is "---" or "..." at the start of a line
// (nothing but a comment after it): in YAML one there is always one,
// never content, and a "---" before any content starts the first document.
func secondDocument(data []byte) int {
	content := false
	for i, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimRight(line, " \t\r")
		marker := func(m string) bool {
			rest, ok := bytes.CutPrefix(line, []byte(m))
			return ok && (len(rest) == 0 || rest[0] == ' ' || rest[0] == '\t')
		}
		switch {
		case marker("---") && content, marker("..."):
			return i + 1
		case marker("---"):
			content = true // the explicit start of the first document
		case len(bytes.TrimSpace(line)) > 0 && bytes.TrimSpace(line)[0] != '#':
			content = true
		}
	}
	return 0
}

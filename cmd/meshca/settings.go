package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/pflag"
)

// Where a setting's value came from, highest precedence first: the
// command line, the --config file, a MESHCA_<FLAG> variable, one of
// Istio's variables (istioAliases), the flag's default. An environment
// source is written "env NAME".
const (
	sourceFlag    = "flag"
	sourceConfig  = "config"
	sourceDefault = "default"
)

// envPrefix starts the variable of every serve flag: MESHCA_ and the
// flag's name in upper snake case (--max-ttl is MESHCA_MAX_TTL).
const envPrefix = "MESHCA_"

// envName is the variable of a flag.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// istioAlias is a variable istiod reads for the same setting as a meshca
// flag, so that an operator replacing istiod's CA keeps its settings.
// Values are parsed as istiod parses them: durations by Go's
// time.ParseDuration ("24h", "2160h", "1h30m"), lists split on commas.
type istioAlias struct {
	Env, Flag string
	// List: a comma-separated list, spaces around entries and empty
	// entries dropped; set but empty it is an empty list, as for istiod.
	// Other variables set but empty count as unset.
	List bool
}

// istioAliases are the variables of istiod's CA (pilot/pkg/bootstrap,
// pilot/pkg/features, pkg/security) and istio-agent's TRUST_DOMAIN.
var istioAliases = []istioAlias{
	{Env: "CA_TRUSTED_NODE_ACCOUNTS", Flag: "trusted-node-accounts", List: true},
	{Env: "TOKEN_AUDIENCES", Flag: "token-audiences", List: true},
	{Env: "DEFAULT_WORKLOAD_CERT_TTL", Flag: "default-ttl"},
	{Env: "MAX_WORKLOAD_CERT_TTL", Flag: "max-ttl"},
	{Env: "CLUSTER_ID", Flag: "cluster-id"},
	{Env: "ROOT_CA_DIR", Flag: "ca-dir"},
	{Env: "CITADEL_SELF_SIGNED_CA_CERT_TTL", Flag: "root-lifetime"},
	{Env: "TRUST_DOMAIN", Flag: "trust-domain"},
}

// MESHCA_ variables that are not settings: secrets read from the
// environment and the test harness's cache; and, by prefix, those
// Kubernetes sets for a Service named meshca (MESHCA_SERVICE_HOST,
// MESHCA_PORT_15012_TCP, ...).
var (
	notSettings       = []string{envCfsslAuthKey, envVaultSecretID, envPKCS11PIN, "MESHCA_CACHE"}
	notSettingsPrefix = []string{"MESHCA_SERVICE_", "MESHCA_PORT"}
)

// settings records where each flag of a command got its value.
type settings struct {
	source     map[string]string // flag -> source
	configFile string
	ignoredEnv []string // MESHCA_ variables that name no flag
}

// resolveSettings fills each flag of fl not given on the command line
// from the first of: the config file (--config, else MESHCA_CONFIG),
// MESHCA_<FLAG>, the flag's Istio variable; environ is the environment
// as os.Environ returns it. A MESHCA_ variable set but empty counts as
// unset. A value that does not parse is an error naming where it came
// from.
func resolveSettings(fl *pflag.FlagSet, environ []string) (*settings, error) {
	env := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	s := &settings{source: map[string]string{}}
	fromFile, err := s.readConfig(fl, env)
	if err != nil {
		return nil, err
	}
	aliases := map[string]istioAlias{}
	for _, a := range istioAliases {
		aliases[a.Flag] = a
	}
	fl.VisitAll(func(f *pflag.Flag) {
		if err == nil && !notConfig[f.Name] {
			err = s.resolve(f, env, fromFile[f.Name], aliases)
		}
	})
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	fl.VisitAll(func(f *pflag.Flag) { known[envName(f.Name)] = true })
	for k := range env {
		if strings.HasPrefix(k, envPrefix) && !known[k] && !isNotSetting(k) {
			s.ignoredEnv = append(s.ignoredEnv, k)
		}
	}
	sort.Strings(s.ignoredEnv)
	return s, nil
}

// readConfig finds the config file (--config, else MESHCA_CONFIG) and
// returns the values it gives, by flag name; none without a file.
func (s *settings) readConfig(fl *pflag.FlagSet, env map[string]string) (map[string][]string, error) {
	cf := fl.Lookup("config")
	if cf == nil {
		return nil, nil
	}
	s.source["config"] = sourceDefault
	switch v := env[envName("config")]; {
	case cf.Changed:
		s.source["config"] = sourceFlag
	case v != "":
		if err := cf.Value.Set(v); err != nil {
			return nil, err
		}
		s.source["config"] = "env " + envName("config")
	}
	if s.configFile = cf.Value.String(); s.configFile == "" {
		return nil, nil
	}
	return readConfigFile(s.configFile, fl, notConfig)
}

// resolve sets f, unless the command line did, from the first of: the
// config file's values, MESHCA_<FLAG>, its Istio variable; and records
// where its value came from.
func (s *settings) resolve(f *pflag.Flag, env map[string]string, fromFile []string, aliases map[string]istioAlias) error {
	src, vals, ok := sourceFlag, []string(nil), f.Changed
	if !ok {
		src, vals, ok = sourceConfig, fromFile, fromFile != nil
	}
	if v := env[envName(f.Name)]; !ok && v != "" {
		src, vals, ok = "env "+envName(f.Name), []string{v}, true
		if isList(f) {
			vals = splitList(v)
		}
	}
	if a, found := aliases[f.Name]; !ok && found {
		if v, set := env[a.Env]; set && (v != "" || a.List) {
			src, vals, ok = "env "+a.Env, []string{v}, true
			if a.List {
				vals = splitList(v)
			}
		}
	}
	if !ok {
		src = sourceDefault
	}
	s.source[f.Name] = src
	if src == sourceFlag || src == sourceDefault {
		return nil
	}
	if err := apply(f, vals); err != nil {
		return s.valueError(f.Name, src, vals, err)
	}
	return nil
}

// valueError says which value of which source did not parse.
func (s *settings) valueError(flag, src string, vals []string, err error) error {
	switch {
	case src == sourceConfig:
		return fmt.Errorf("--config %s: --%s (%s): %q: %w", s.configFile, flag, configKey(flag), strings.Join(vals, ","), err)
	case strings.HasPrefix(src, "env "+envPrefix):
		return fmt.Errorf("%s=%q: --%s: %w", strings.TrimPrefix(src, "env "), strings.Join(vals, ","), flag, err)
	}
	return fmt.Errorf("%s=%q (Istio's variable, taken for --%s): %w", strings.TrimPrefix(src, "env "), strings.Join(vals, ","), flag, err)
}

// apply sets f to vals: a list flag to all of them, another to the one.
func apply(f *pflag.Flag, vals []string) error {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		return sv.Replace(vals)
	}
	if len(vals) != 1 {
		return fmt.Errorf("takes one value, not a list of %d", len(vals))
	}
	return f.Value.Set(vals[0])
}

func isList(f *pflag.Flag) bool {
	_, ok := f.Value.(pflag.SliceValue)
	return ok
}

// splitList splits a comma-separated list, dropping spaces around
// entries and empty entries.
func splitList(v string) []string {
	out := []string{}
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

func isNotSetting(k string) bool {
	for _, p := range notSettingsPrefix {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return slices.Contains(notSettings, k)
}

// explain adds to err, a refusal of the settings, where each flag it
// names got its value when that was not the command line or the default:
// an operator looks for a variable or a config key, not a flag.
func (s *settings) explain(err error) error {
	if err == nil || s == nil {
		return err
	}
	msg := err.Error()
	var notes []string
	flags := make([]string, 0, len(s.source))
	for f := range s.source {
		flags = append(flags, f)
	}
	sort.Strings(flags)
	for _, f := range flags {
		src := s.source[f]
		if src == sourceFlag || src == sourceDefault || !mentions(msg, "--"+f) {
			continue
		}
		if src == sourceConfig {
			src = "config " + configKey(f)
		}
		notes = append(notes, "--"+f+" from "+src)
	}
	if len(notes) == 0 {
		return err
	}
	return &settingsError{err: err, notes: notes}
}

// mentions reports whether msg names flag as a whole word.
func mentions(msg, flag string) bool {
	for i := 0; ; {
		j := strings.Index(msg[i:], flag)
		if j < 0 {
			return false
		}
		end := i + j + len(flag)
		if end == len(msg) || !isFlagChar(msg[end]) {
			return true
		}
		i = end
	}
}

func isFlagChar(c byte) bool {
	return c == '-' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}

// settingsError is a refused setting with the sources of the flags it
// names.
type settingsError struct {
	err   error
	notes []string
}

func (e *settingsError) Error() string {
	return e.err.Error() + " (" + strings.Join(e.notes, "; ") + ")"
}

func (e *settingsError) Unwrap() error { return e.err }

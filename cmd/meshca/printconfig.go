package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// notConfig are serve's flags that are no settings of a server: they say
// how to read the settings or what to do with them, and a config file
// cannot hold them.
var notConfig = map[string]bool{"help": true, "config": true, "print-config": true}

// printConfig writes the settings fl holds as a ServeConfig file, in the
// help's groups, each value followed by where it came from: flag, config,
// env NAME or default. Given back as --config the file yields the same
// settings, except a value the audit redacts (a URL's password, anything
// that looks like key material), which reads "<redacted>" and says so.
func printConfig(w io.Writer, fl *pflag.FlagSet, s *settings, groups []flagGroup) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# The settings meshca serve runs with; after each, where it came from:\n")
	fmt.Fprintf(&b, "# flag, config (the --config file), env NAME or default.\n")
	if s.configFile != "" {
		fmt.Fprintf(&b, "# --config: %s (%s)\n", s.configFile, s.source["config"])
	}
	fmt.Fprintf(&b, "apiVersion: %s\nkind: %s\n", ConfigAPIVersion, ConfigKind)
	byGroup := map[string][]*pflag.Flag{}
	fl.VisitAll(func(f *pflag.Flag) {
		if !notConfig[f.Name] {
			g := flagGroupOf(f)
			byGroup[g] = append(byGroup[g], f)
		}
	})
	titles := make([]string, 0, len(groups)+1)
	for _, g := range groups {
		titles = append(titles, g.title)
	}
	titles = append(titles, "") // flags of no group, should there be any
	for _, title := range titles {
		flags := byGroup[title]
		if len(flags) == 0 {
			continue
		}
		if title == "" {
			title = "Other"
		}
		fmt.Fprintf(&b, "\n# %s\n", title)
		section := ""
		for _, f := range flags {
			key := configKey(f.Name)
			indent := ""
			if sec, k, nested := strings.Cut(key, "."); nested {
				if sec != section {
					fmt.Fprintf(&b, "%s:\n", sec)
					section = sec
				}
				key, indent = k, "  "
			} else {
				section = ""
			}
			v, red, err := configValue(f)
			if err != nil {
				return err
			}
			src := s.source[f.Name]
			if src == "" {
				src = sourceDefault
			}
			if red {
				src += ", redacted: give it again"
			}
			fmt.Fprintf(&b, "%s%s: %s # %s\n", indent, key, v, src)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// configValue is f's value as YAML (JSON, which YAML reads): a list, a
// boolean or number as such, anything else a quoted string; redacted
// says the audit's redaction replaced some of it.
func configValue(f *pflag.Flag) (v string, redacted bool, err error) {
	var x any
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		list := []string{}
		for _, e := range sv.GetSlice() {
			r := redact(f.Name, e)
			redacted = redacted || r != e
			list = append(list, r)
		}
		x = list
	} else {
		raw := f.Value.String()
		r := redact(f.Name, raw)
		redacted = r != raw
		x = typed(f.Value.Type(), r)
	}
	js, err := json.Marshal(x)
	return string(js), redacted, err
}

package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// groupAnnotation is the pflag annotation naming the help group of a flag.
const groupAnnotation = "meshca.io/help-group"

// flagGroup is a group of flags in a command's help: its title, the flags
// the short help names, and the function that registers its flags.
type flagGroup struct {
	title    string
	key      []string
	register func(*pflag.FlagSet)
}

// registerGroups registers the flags of each group on fl in turn and
// annotates every flag a group's register added with the group's title:
// a flag belongs to the group whose block registered it.
func registerGroups(fl *pflag.FlagSet, groups []flagGroup) {
	for _, g := range groups {
		g.register(fl)
		fl.VisitAll(func(f *pflag.Flag) {
			if _, done := f.Annotations[groupAnnotation]; !done {
				_ = fl.SetAnnotation(f.Name, groupAnnotation, []string{g.title})
			}
		})
	}
}

// flagGroupOf is the title of f's group, empty when it has none.
func flagGroupOf(f *pflag.Flag) string {
	if g := f.Annotations[groupAnnotation]; len(g) == 1 {
		return g[0]
	}
	return ""
}

// helpFlag is a --help that also takes "all": to cobra it is a bool
// (cobra only asks whether help was asked for), --help=all sets all.
type helpFlag struct{ set, all bool }

func (h *helpFlag) String() string { return strconv.FormatBool(h.set) }
func (h *helpFlag) Type() string   { return "bool" }

func (h *helpFlag) Set(s string) error {
	if s == "all" {
		h.set, h.all = true, true
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q is neither a boolean nor all", s)
	}
	h.set, h.all = b, false
	return nil
}

// setGroupedHelp gives cmd, whose flags registerGroups registered, a
// short help (usage, examples, one line a group naming its key flags)
// and, with --help=all, every flag by group.
func setGroupedHelp(cmd *cobra.Command, groups []flagGroup) {
	h := &helpFlag{}
	cmd.Flags().VarPF(h, "help", "h", "help for "+cmd.Name()+"; --help=all lists every flag, by group").NoOptDefVal = "true"
	cmd.SetHelpFunc(func(c *cobra.Command, _ []string) {
		if h.all {
			writeFullHelp(c.OutOrStdout(), c, groups)
			return
		}
		writeShortHelp(c.OutOrStdout(), c, groups)
	})
}

// writeShortHelp writes the help that fits a screen.
func writeShortHelp(w io.Writer, cmd *cobra.Command, groups []flagGroup) {
	n := 0
	cmd.Flags().VisitAll(func(*pflag.Flag) { n++ })
	fmt.Fprintf(w, "%s\n\nUsage:\n  %s\n", helpText(cmd), cmd.UseLine())
	if cmd.Example != "" {
		fmt.Fprintf(w, "\nExamples:\n%s\n", cmd.Example)
	}
	fmt.Fprintf(w, "\nFlags, by group (a few of each; %d in all):\n", n)
	width := 0
	for _, g := range groups {
		width = max(width, len(g.title))
	}
	for _, g := range groups {
		fmt.Fprintf(w, "  %-*s  --%s\n", width, g.title, strings.Join(g.key, ", --"))
	}
	fmt.Fprintf(w, "\nRun \"%s --help=all\" for every flag, by group.\n", cmd.CommandPath())
}

// writeFullHelp writes every flag of cmd under its group's title; flags
// of no group (--help) come last.
func writeFullHelp(w io.Writer, cmd *cobra.Command, groups []flagGroup) {
	fmt.Fprintf(w, "%s\n\nUsage:\n  %s\n", helpText(cmd), cmd.UseLine())
	byGroup := map[string]*pflag.FlagSet{}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		g := flagGroupOf(f)
		if byGroup[g] == nil {
			byGroup[g] = pflag.NewFlagSet(g, pflag.ContinueOnError)
		}
		byGroup[g].AddFlag(f)
	})
	titles := make([]string, 0, len(groups)+1)
	for _, g := range groups {
		titles = append(titles, g.title)
	}
	for _, t := range append(titles, "") {
		fs := byGroup[t]
		if fs == nil {
			continue
		}
		if t == "" {
			t = "Other"
		}
		fmt.Fprintf(w, "\n%s:\n%s", t, fs.FlagUsagesWrapped(120))
	}
}

// helpText is cmd's Long, else its Short.
func helpText(cmd *cobra.Command) string {
	if cmd.Long != "" {
		return strings.TrimSpace(cmd.Long)
	}
	return cmd.Short
}

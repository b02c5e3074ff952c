package load

import (
	"os/exec"
	"strings"
)

// budgets are meshca serve's per-caller limits, as flags that take 0 for
// "no limit", and its cap of the unauthenticated requests of one address:
// every simulated node connects from 127.0.0.1, where a cluster's each
// have their own.
var budgets = []string{"caller-rate", "caller-max-in-flight", "node-proxy-rate", "node-proxy-max-in-flight", "max-unauthenticated-streams-per-peer"}

// Unlimited returns the flags that turn off, on the meshca binary bin,
// the budgets of one caller: a measurement of what a request costs must
// not be cut short by what one caller may ask. Flags bin does not know (an
// older build) are left out.
func Unlimited(bin string) []string {
	help := ServeHelp(bin)
	var out []string
	for _, f := range budgets {
		if HasFlag(help, f) {
			out = append(out, "--"+f+"=0")
		}
	}
	return out
}

// ServeHelp is the help of every serve flag of the meshca binary bin:
// `serve --help=all`, or `serve --help` of a build older than the grouped
// help, which listed them all.
func ServeHelp(bin string) string {
	if out, err := exec.Command(bin, "serve", "--help=all").CombinedOutput(); err == nil {
		return string(out)
	}
	out, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	return string(out)
}

// HasFlag reports whether help, ServeHelp's, lists --flag.
func HasFlag(help, flag string) bool { return strings.Contains(help, "--"+flag+" ") }

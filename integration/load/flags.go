package load

import (
	"os/exec"
	"strings"
)

// budgets are meshca serve's per-caller limits, as flags that take 0 for
// "no limit".
var budgets = []string{"caller-rate", "caller-max-in-flight", "node-proxy-rate", "node-proxy-max-in-flight"}

// Unlimited returns the flags that turn off, on the meshca binary bin,
// the budgets of one caller: a measurement of what a request costs must
// not be cut short by what one caller may ask. Flags bin does not know (an
// older build) are left out.
func Unlimited(bin string) []string {
	help, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	var out []string
	for _, f := range budgets {
		if HasFlag(string(help), f) {
			out = append(out, "--"+f+"=0")
		}
	}
	return out
}

// HasFlag reports whether help, the output of `meshca serve --help`,
// lists --flag.
func HasFlag(help, flag string) bool { return strings.Contains(help, "--"+flag+" ") }

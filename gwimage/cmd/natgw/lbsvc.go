package main

import (
	"fmt"
	"strings"

	"github.com/natgw/natgw/gwimage/lbsvc"
)

// runLBSvc carries out one lb-svc.sh call (gwimage/lbsvc): like the
// script, it prints the subcommand and its rules to stdout, and a failure
// to stderr.
func runLBSvc(e env, args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(e.stderr, "usage: lb-svc.sh init|eip-add|dnat-add|dnat-del RULE...")
		return exitFail
	}
	call, err := lbsvc.NewCall(args[0], args[1:])
	if err != nil {
		fmt.Fprintf(e.stderr, "lb-svc.sh: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(e.stdout, "%s %s\n", call.Op, strings.Join(call.Rules, " "))
	if err := call.Run(); err != nil {
		fmt.Fprintf(e.stderr, "lb-svc.sh %s: %v\n", call.Op, err)
		return exitFail
	}
	return exitOK
}

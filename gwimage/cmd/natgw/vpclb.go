package main

import (
	"fmt"

	"github.com/natgw/natgw/gwimage/vpclb"
)

// runIP is `ip [-4|-6] route replace CIDR via GW` (gwimage/vpclb).
func runIP(e env, args []string) int {
	r, err := vpclb.ParseRoute(args)
	if err != nil {
		fmt.Fprintf(e.stderr, "ip: %v\n", err)
		return exitUsage
	}
	if err := r.Replace(); err != nil {
		fmt.Fprintf(e.stderr, "ip: %v\n", err)
		return exitUsage
	}
	return exitOK
}

// runIptables is `iptables|ip6tables -t nat -I POSTROUTING -d CIDR -j
// MASQUERADE` (gwimage/vpclb).
func runIptables(e env, prog string, args []string) int {
	m, err := vpclb.ParseMasquerade(prog, args)
	if err != nil {
		fmt.Fprintf(e.stderr, "%s: %v\n", prog, err)
		return exitUsage
	}
	if err := m.Insert(); err != nil {
		fmt.Fprintf(e.stderr, "%s: %v\n", prog, err)
		return exitFail
	}
	return exitOK
}

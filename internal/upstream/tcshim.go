package upstream

// TCWithoutFqCodel returns a /bin/sh script to put first on the PATH of
// upstream's nat-gateway.sh as `tc`: it skips (exit 0) a qdisc command
// that names fq_codel and execs realTC (an absolute path) with every other
// command, arguments intact.
//
// v1.16.2's eip-*-qos-add and qos-add give each HTB class an fq_codel
// leaf with `exec_cmd tc qdisc replace ... fq_codel`; on a kernel without
// fq_codel (CONFIG_NET_SCH_FQ_CODEL unset, as on natgw's CI kernel) that
// ends the call with exit 2 after the class was made and before the tc
// filter that feeds it. Without the leaf command the class keeps HTB's
// default leaf, which is what natgw's shaper uses on such a kernel
// (nat/shape), so the two can be compared: upstream's shape without
// fq_codel.
func TCWithoutFqCodel(realTC string) string {
	return "#!/bin/sh\n# natgw: this kernel has no fq_codel; keep HTB's default leaf (internal/upstream.TCWithoutFqCodel).\n" +
		"case \" $* \" in *\" qdisc \"*\" fq_codel \"*) exit 0 ;; esac\nexec " + realTC + " \"$@\"\n"
}

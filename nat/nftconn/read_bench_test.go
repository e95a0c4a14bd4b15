package nftconn

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/nftables/expr"
)

// readBenchN is the size of the chain and of the map the read benchmarks
// read.
const readBenchN = 1000

// BenchmarkReadRules: one Rules read (Netlink: a socket dialed for the
// read, one rule dump) of a chain of readBenchN tagged rules, in a
// namespace the benchmark makes (root needed). Its figure is the
// instructions of one read under cachegrind (load-independent): the setup
// runs once, so the instructions of two -benchtime counts differ by the
// reads alone.
func BenchmarkReadRules(b *testing.B) {
	ns, _ := labNS(b, "nftbenchrules")
	ctx := context.Background()
	k := Open(ns)
	tx := baseTx()
	for i := range readBenchN {
		tx.AppendRule(testTable, testChain, Rule{Exprs: []expr.Any{&expr.Masq{}}, Text: "masquerade", Tag: fmt.Sprintf("natgw lbsvc dnat 10.0.%d.%d:80", i/256, i%256)})
		if (i+1)%100 == 0 { // rule adds are echoed: a few at a time fit the receive buffer
			if err := k.Apply(ctx, tx); err != nil {
				b.Fatal(err)
			}
			tx = &Tx{}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if rules, err := k.Rules(ctx, testTable, testChain); err != nil || len(rules) != readBenchN {
			b.Fatalf("%d rules (%v), want %d", len(rules), err, readBenchN)
		}
	}
}

// BenchmarkReadMapElements: one MapElements read (Netlink) of a map of
// readBenchN elements with comments, as BenchmarkReadRules.
func BenchmarkReadMapElements(b *testing.B) {
	ns, _ := labNS(b, "nftbenchmap")
	ctx := context.Background()
	tx := baseTx()
	tx.AddMap(testTable, classMap)
	els := make([]Element, readBenchN)
	for i := range els {
		els[i] = Element{Key: []byte{byte(i), byte(i >> 8), 0, 0}, Val: []byte{byte(i), 0, 0x47, 0x4e}, Comment: fmt.Sprintf("natgw eip %d lim=100", i)}
	}
	tx.AddElements(testTable, classMap.Name, els...)
	k := Open(ns)
	if err := k.Apply(ctx, tx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if got, err := k.MapElements(ctx, testTable, classMap.Name); err != nil || len(got) != readBenchN {
			b.Fatalf("%d elements (%v), want %d", len(got), err, readBenchN)
		}
	}
}

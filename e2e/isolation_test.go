package e2e

import (
	"testing"
	"time"

	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
)

// foreignNft is someone else's nftables state in the gateway namespace: a
// table of another family, a table whose name starts like ours, a set,
// base chains on natgw's hooks.
const foreignNft = `table inet foreign {
	set blocked {
		type ipv4_addr
		elements = { 203.0.113.7 }
	}
	chain pre {
		type filter hook prerouting priority -250; policy accept;
		ip saddr @blocked drop
	}
	chain post {
		type nat hook postrouting priority 50; policy accept;
		ip daddr 203.0.113.0/24 return
	}
}
table ip natgw_other {
	chain c {
		ip daddr 203.0.113.8 accept
	}
}
`

// foreignIptables is someone else's iptables-legacy state: rules in the
// built-in chains natgw hooks into, and a custom chain.
const foreignIptables = `*nat
:FOREIGN - [0:0]
-A PREROUTING -s 203.0.113.0/24 -j FOREIGN
-A POSTROUTING -d 203.0.113.0/24 -j RETURN
-A FOREIGN -s 203.0.113.9 -j RETURN
COMMIT
*filter
-A FORWARD -s 203.0.113.10 -j DROP
COMMIT
*mangle
-A PREROUTING -d 203.0.113.11 -j MARK --set-xmark 0x7/0xffffffff
COMMIT
`

// TestIsolation is scenario 6: foreign nftables tables and iptables rules
// placed in a gateway namespace beforehand are identical after a whole
// lifecycle (program, traffic, update, delete).
func TestIsolation(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		s := fw.New(t, fw.Options{Dataplane: dp, NoController: true})
		g := s.Order[0]
		if _, err := netlab.Exec(s.Ctx, g.GW, foreignNft, "nft", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		if _, err := netlab.Exec(s.Ctx, g.GW, foreignIptables, "iptables-legacy-restore", "--noflush"); err != nil {
			t.Fatal(err)
		}
		before, err := fw.ReadForeign(s.Ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		if before.Nft == "" || before.Iptables == "" {
			t.Fatalf("foreign state not installed: %+v", before)
		}
		s.StartController()
		o, _ := programLifecycle(t, s, g, fw.IPv4)
		checkProgrammed(t, s, g, o.all())
		mid, err := fw.ReadForeign(s.Ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		s.DeleteAll(60 * time.Second)
		left := checkEmpty(t, s, g, nil)
		after, err := fw.ReadForeign(s.Ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			when string
			got  fw.Foreign
		}{{"while programmed", mid}, {"after delete", after}} {
			if c.got.Nft != before.Nft {
				t.Errorf("foreign nft state changed %s:\nbefore:\n%s\nnow:\n%s", c.when, before.Nft, c.got.Nft)
			}
			if c.got.Iptables != before.Iptables {
				t.Errorf("foreign iptables state changed %s:\nbefore:\n%s\nnow:\n%s", c.when, before.Iptables, c.got.Iptables)
			}
		}
		fw.Summary(t, "6-isolation", dp,
			"foreign_nft_lines", lines(before.Nft), "foreign_iptables_lines", lines(before.Iptables),
			"identical_while_programmed", mid == before, "identical_after_delete", after == before, "natgw_left_after_delete", left)
	})
}

func lines(s string) int {
	n := 0
	for _, c := range s {
		if c == '\n' {
			n++
		}
	}
	return n
}

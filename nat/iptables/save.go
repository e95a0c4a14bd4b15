package iptables

import (
	"bufio"
	"fmt"
	"strings"
)

// dump is parsed iptables-save output: per table, the declared chains and
// the rules of each chain in order.
type dump map[string]*tableDump

type tableDump struct {
	chains map[string]bool
	rules  map[string][]Rule
}

// table returns the named table; a table absent from the dump is empty.
func (d dump) table(name string) *tableDump {
	if t, ok := d[name]; ok {
		return t
	}
	return &tableDump{chains: map[string]bool{}, rules: map[string][]Rule{}}
}

// parseSave parses iptables-save output.
func parseSave(out string) (dump, error) {
	d := dump{}
	var cur *tableDump
	var curName string
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			curName = line[1:]
			cur = &tableDump{chains: map[string]bool{}, rules: map[string][]Rule{}}
			d[curName] = cur
		case line == "COMMIT":
			cur = nil
		case cur == nil:
			return nil, fmt.Errorf("iptables-save line %d: %q outside a table", n, line)
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			cur.chains[name] = true
		case strings.HasPrefix(line, "-A "):
			args, err := splitArgs(line[3:])
			if err != nil {
				return nil, fmt.Errorf("iptables-save line %d: %w", n, err)
			}
			if len(args) == 0 {
				return nil, fmt.Errorf("iptables-save line %d: rule without chain", n)
			}
			cur.rules[args[0]] = append(cur.rules[args[0]], Rule{Table: curName, Chain: args[0], Args: args[1:]})
		default:
			return nil, fmt.Errorf("iptables-save line %d: unexpected %q", n, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read iptables-save output: %w", err)
	}
	return d, nil
}

// splitArgs splits a rule line into words like iptables-restore does:
// whitespace separates, double quotes group, and a backslash inside quotes
// escapes the next character.
func splitArgs(s string) ([]string, error) {
	var out []string
	var b strings.Builder
	inWord, inQuote := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inQuote && c == '\\' && i+1 < len(s):
			i++
			b.WriteByte(s[i])
		case c == '"':
			inQuote = !inQuote
			inWord = true
		case !inQuote && (c == ' ' || c == '\t'):
			if inWord {
				out = append(out, b.String())
				b.Reset()
				inWord = false
			}
		default:
			b.WriteByte(c)
			inWord = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inWord {
		out = append(out, b.String())
	}
	return out, nil
}

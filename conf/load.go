package conf

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// Load reads the main file and then every *.toml in dropinDir in lexical
// order, each overriding the keys it sets, on top of Default(). A missing
// main file is fine unless required; a missing drop-in dir is always fine.
// Errors name the file and the key.
func Load(file, dropinDir string, required bool) (*Config, error) {
	cfg := Default()
	origin := map[string]string{} // dotted key -> file that set it last

	files := []string{}
	if file != "" {
		if _, err := os.Stat(file); err == nil {
			files = append(files, file)
		} else if required || !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("config %s: %w", file, err)
		}
	}
	if dropinDir != "" {
		matches, err := filepath.Glob(filepath.Join(dropinDir, "*.toml"))
		if err != nil {
			return nil, fmt.Errorf("config dir %s: %w", dropinDir, err)
		}
		sort.Strings(matches)
		files = append(files, matches...)
	}
	for _, f := range files {
		if err := decodeFile(f, cfg, origin); err != nil {
			return nil, err
		}
	}
	if err := cfg.Validate(); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			if f := originOf(origin, fe.Key); f != "" {
				return nil, fmt.Errorf("config %s: %w", f, err)
			}
		}
		return nil, fmt.Errorf("config: %w", err)
	}
	return cfg, nil
}

func decodeFile(path string, cfg *Config, origin map[string]string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if err := checkDurations(path, data); err != nil {
		return err
	}
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		return fmt.Errorf("config %s: %s", path, describe(err))
	}
	// Record which file set which key, so a value that fails Validate
	// later is reported against the file that wrote it.
	var raw map[string]any
	if err := toml.Unmarshal(data, &raw); err == nil {
		walkKeys("", raw, func(k string) { origin[k] = path })
	}
	return nil
}

// durationKeys are the dotted keys of every Duration field of Config.
var durationKeys = func() map[string]bool {
	keys := map[string]bool{}
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if name == "" || name == "-" {
				continue
			}
			switch {
			case f.Type == reflect.TypeFor[Duration]():
				keys[prefix+name] = true
			case f.Type.Kind() == reflect.Struct:
				walk(prefix+name+".", f.Type)
			}
		}
	}
	walk("", reflect.TypeFor[Config]())
	return keys
}()

// checkDurations refuses a duration written as anything but a string.
// Duration is an int64, so the decoder would store a bare 5 as 5ns
// without ever calling UnmarshalText: pull_timeout = 5 made every pull
// time out at once. Syntax errors are left to the decoder, which reports
// them with more detail.
func checkDurations(path string, data []byte) error {
	var p unstable.Parser
	p.Reset(data)
	var table []string
	// check looks at one key = value, descending into inline tables.
	var check func(prefix []string, kv *unstable.Node) error
	check = func(prefix []string, kv *unstable.Node) error {
		parts := append(slices.Clone(prefix), keyParts(kv)...)
		v := kv.Value()
		if v.Kind == unstable.InlineTable {
			for it := v.Children(); it.Next(); {
				if err := check(parts, it.Node()); err != nil {
					return err
				}
			}
			return nil
		}
		if key := strings.Join(parts, "."); durationKeys[key] && v.Kind != unstable.String {
			return fmt.Errorf("config %s: %s: %s is not a duration; write it as a string with a unit, like \"30s\" or \"5m\" (line %d)",
				path, key, p.Raw(v.Raw), p.Shape(v.Raw).Start.Line)
		}
		return nil
	}
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = keyParts(e)
		case unstable.KeyValue:
			if err := check(table, e); err != nil {
				return err
			}
		}
	}
	return nil
}

func keyParts(n *unstable.Node) []string {
	var parts []string
	for it := n.Key(); it.Next(); {
		parts = append(parts, string(it.Node().Data))
	}
	return parts
}

// describe turns a go-toml error into "key: problem (line N)".
func describe(err error) string {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) && len(strict.Errors) > 0 {
		parts := make([]string, 0, len(strict.Errors))
		for _, e := range strict.Errors {
			row, _ := e.Position()
			parts = append(parts, fmt.Sprintf("unknown key %q (line %d)", strings.Join(e.Key(), "."), row))
		}
		return strings.Join(parts, "; ")
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, _ := de.Position()
		if k := de.Key(); len(k) > 0 {
			return fmt.Sprintf("%s: %s (line %d)", strings.Join(k, "."), de.Error(), row)
		}
		return fmt.Sprintf("%s (line %d)", de.Error(), row)
	}
	return err.Error()
}

func walkKeys(prefix string, m map[string]any, fn func(string)) {
	for k, v := range m {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		fn(key)
		if sub, ok := v.(map[string]any); ok {
			walkKeys(key, sub, fn)
		}
	}
}

// originOf finds the file that set key or its closest parent table.
func originOf(origin map[string]string, key string) string {
	for k := key; k != ""; {
		if f, ok := origin[k]; ok {
			return f
		}
		i := strings.LastIndex(k, ".")
		if i < 0 {
			break
		}
		k = k[:i]
	}
	return ""
}

// Encode writes the configuration as commented TOML.
func (c *Config) Encode() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString("# pinrt configuration. Drop-in files in pinrt.d/*.toml override it in lexical order.\n\n")
	enc := toml.NewEncoder(&buf).SetIndentTables(true)
	if err := enc.Encode(c); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

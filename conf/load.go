package conf

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"
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

// chart-render renders a Helm chart the way `helm template` does, for tests on machines without
// a helm binary: Go's text/template with the sprig function library (as Helm uses them) plus
// Helm's toYaml, values.yaml coalesced with each -f file in order, templates rendered in file
// name order, files starting with "_" only defining named templates.
//
// Usage: chart-render CHART_DIR [-f VALUES.yaml]...
//
// It supports what the linkerd2-cni chart uses: .Values, .Chart (Name, Version, AppVersion),
// .Release (Name, Namespace, Service), the latter two as `linkerd install-cni` sets them
// ("linkerd-cni", "CLI"; Helm's own path is tested with the real helm binary). It does not implement include, tpl, lookup, required,
// .Capabilities or .Files.
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	sprig "github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

type chartMeta struct {
	Name       string `yaml:"name"`
	Version    string `yaml:"version"`
	AppVersion string `yaml:"appVersion"`
}

// coalesce merges src into dst: maps merge key by key, anything else in src replaces dst.
func coalesce(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		sm, sok := v.(map[string]interface{})
		dm, dok := dst[k].(map[string]interface{})
		if sok && dok {
			dst[k] = coalesce(dm, sm)
		} else {
			dst[k] = v
		}
	}
	return dst
}

func readYAML(path string, out interface{}) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// toYaml is Helm's: the YAML of a value without the trailing newline.
func toYaml(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

func run(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("usage: chart-render CHART_DIR [-f VALUES.yaml]...")
	}
	chartDir := args[0]
	var meta chartMeta
	if err := readYAML(filepath.Join(chartDir, "Chart.yaml"), &meta); err != nil {
		return err
	}
	values := map[string]interface{}{}
	if err := readYAML(filepath.Join(chartDir, "values.yaml"), &values); err != nil {
		return err
	}
	rest := args[1:]
	for len(rest) > 0 {
		if rest[0] != "-f" || len(rest) < 2 {
			return fmt.Errorf("unexpected argument %q", rest[0])
		}
		override := map[string]interface{}{}
		if err := readYAML(rest[1], &override); err != nil {
			return err
		}
		values = coalesce(values, override)
		rest = rest[2:]
	}

	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = toYaml

	files, err := filepath.Glob(filepath.Join(chartDir, "templates", "*"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	root := template.New("chart").Funcs(funcs).Option("missingkey=error")
	var names []string
	for _, f := range files {
		base := filepath.Base(f)
		if !strings.HasSuffix(base, ".yaml") && !strings.HasSuffix(base, ".tpl") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		name := meta.Name + "/templates/" + base
		if _, err := root.New(name).Parse(string(src)); err != nil {
			return err
		}
		if !strings.HasPrefix(base, "_") {
			names = append(names, name)
		}
	}

	data := map[string]interface{}{
		"Values":  values,
		"Chart":   map[string]interface{}{"Name": meta.Name, "Version": meta.Version, "AppVersion": meta.AppVersion},
		"Release": map[string]interface{}{"Name": meta.Name, "Namespace": "linkerd-cni", "Service": "CLI"},
	}
	var out bytes.Buffer
	for _, name := range names {
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return err
		}
		if strings.TrimSpace(buf.String()) == "" {
			continue
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, strings.TrimSpace(buf.String()))
	}
	_, err = os.Stdout.Write(out.Bytes())
	return err
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "chart-render:", err)
		os.Exit(1)
	}
}

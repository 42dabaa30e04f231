"""Compare two benchmark JSON files: which cases got slower or faster beyond noise."""
import json


def _key(row):
    return (row.get("suite", ""), row.get("case") or row.get("model", ""), row.get("batch"),
            row.get("engine", ""))


def _rows(path):
    with open(path) as f:
        doc = json.load(f)
    return {_key(r): r for r in doc.get("rows", []) if "median_us" in r}


def compare(old_path, new_path, threshold=0.10):
    """(slower, faster, unchanged) lists of (key, old µs, new µs, ratio new/old).

    A change counts only when the ratio of medians passes ``threshold`` and the
    new median lies outside the old run's spread (its p90, or p90 mirrored below
    the median): shifts inside one run's own noise are not reported.
    """
    old, new = _rows(old_path), _rows(new_path)
    slower, faster, same = [], [], []
    for key in old:
        if key not in new:
            continue
        o, n = old[key], new[key]
        ratio = n["median_us"] / o["median_us"]
        noise_o = max(o.get("p90_us", o["median_us"]) / o["median_us"] - 1.0, 0.0)
        noise_n = max(n.get("p90_us", n["median_us"]) / n["median_us"] - 1.0, 0.0)
        margin = max(threshold, noise_o, noise_n)
        entry = (key, o["median_us"], n["median_us"], ratio)
        if ratio > 1.0 + margin:
            slower.append(entry)
        elif ratio < 1.0 / (1.0 + margin):
            faster.append(entry)
        else:
            same.append(entry)
    slower.sort(key=lambda e: -e[3])
    faster.sort(key=lambda e: e[3])
    return slower, faster, same


def format_comparison(old_path, new_path, threshold=0.10):
    slower, faster, same = compare(old_path, new_path, threshold)
    lines = ["%s -> %s: %d slower, %d faster, %d within noise (threshold %.0f%% or the runs' "
             "p90 spread)" % (old_path, new_path, len(slower), len(faster), len(same),
                              threshold * 100)]

    def name(key):
        suite, case, batch, engine = key
        return "%s %s%s [%s]" % (suite, case, "" if batch is None else " b%s" % batch, engine)
    for title, entries in (("slower", slower), ("faster", faster)):
        if entries:
            lines.append("%s:" % title)
            for key, o, n, r in entries:
                lines.append("  %-60s %10.1f -> %10.1f us  x%.2f" % (name(key), o, n, r))
    return "\n".join(lines)

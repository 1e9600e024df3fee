"""Comparing two top-k results of the same inputs where the select may break exact ties differently."""


def top_k_difference(a, b, scores, lens, topk: int) -> str | None:
    """None when the top-k rows `a` and `b` ([rows, topk] int32) of the same inputs agree, else what differs.

    Rows up to `topk` long must be equal as sets. Longer rows must both be a top-k of the kernel's own fp32
    `scores` ([rows, >= length]: distinct positions below the length, every selected score >= every unselected
    one), which leaves them differing only among positions tied at exactly the k-th score: the select places
    those in atomic arrival order, so which of them fill the last slots may differ from call to call. Such a
    difference is printed (run with -s)."""
    import torch

    for r, length in enumerate(lens):
        ra, rb = torch.sort(a[r]).values, torch.sort(b[r]).values
        if torch.equal(ra, rb):
            continue
        if length <= topk:
            return f"row {r} (length {length} <= {topk}) differs"
        s = scores[r, :length]
        kth = torch.topk(s, topk).values[-1]
        for name, sel in (("first", ra.long()), ("second", rb.long())):
            in_range = bool(((sel >= 0) & (sel < length)).all())
            mask = torch.zeros(length, dtype=torch.bool, device=s.device)
            if in_range:
                mask[sel] = True
            if not in_range or int(mask.sum()) != topk or not bool(s[mask].min() >= s[~mask].max()):
                return f"row {r}: the {name} set is no top-{topk} of the kernel's scores"
        # Both hold every position above the k-th score (fewer than topk), so they differ among tied ones only.
        print(f"row {r}: the sets differ only among the {int((s == kth).sum())} positions tied at the k-th score "
              f"{kth.item()!r}")
    return None

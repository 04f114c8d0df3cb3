"""Hardware vendors as plug-ins: each is a package ``platforms/<vendor>/``
behind the interface ``llmdeploy.platform`` declares (its platforms' rows,
the facts commands that list its devices and their parsers, the device files
a container needs, the live view's query, the files of a log bundle, the
check verify-comm runs and the word its pictures use for a device).

Registering one is one line in ``VENDORS`` below: the package and the
platform names it declares. The core reads this registry to validate an
inventory's ``platform`` and loads a vendor's package only when a cluster
names one of its platforms; nothing here imports a vendor. A vendor's
package checks, when it loads, that it declares exactly the names listed
here (``llmdeploy.platform.vendor``).

Layer: below roles, above the core; a vendor imports only ``llmdeploy``.
"""

# vendor package -> the platform names it declares: one line per vendor
VENDORS: dict[str, tuple[str, ...]] = {
    "ascend": ("a3", "a2"),
    "nvidia": ("b200", "b300", "gb200", "gb300", "h200"),
}

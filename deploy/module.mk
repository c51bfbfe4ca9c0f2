# deploy/: the systemd unit, the example config and ringd.pc. Installed
# files name installed paths: the unit's ExecStart and config, the .pc's
# libdir and includedir are rewritten for PREFIX, BINDIR, SYSCONFDIR,
# LIBDIR and INCLUDEDIR (DESTDIR only stages the tree).
INSTALL_TARGETS += install-deploy
.PHONY: install-deploy
# The unit and ringd.pc are written by this recipe, not kept as build
# targets: a cached copy would keep the paths of an earlier install with
# another PREFIX. The unit in the tree names /usr/local/bin/ringd and
# /etc/ringd (what a plain make install gives).
install-deploy:
	install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PKGCONFIGDIR) \
	    $(DESTDIR)$(SYSCONFDIR)/ringd $(DESTDIR)$(DOCDIR) \
	    $(DESTDIR)$(SYSUSERSDIR)
	sed -e 's|/usr/local/bin/ringd|$(BINDIR)/ringd|' \
	    -e 's|/etc/ringd/|$(SYSCONFDIR)/ringd/|g' \
	    -e 's|/usr/local/share/doc/ringd|$(DOCDIR)|' deploy/ringd.service \
	    > $(DESTDIR)$(UNITDIR)/ringd.service
	chmod 644 $(DESTDIR)$(UNITDIR)/ringd.service
	install -m 644 deploy/ringd.sysusers $(DESTDIR)$(SYSUSERSDIR)/ringd.conf
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@DOCDIR@|$(DOCDIR)|' \
	    -e "s|@VERSION@|$$(sed -n 's/^#define DMN_VERSION \"\(.*\)\"/\1/p' \
	        daemon/dmn.h)|" deploy/ringd.pc.in \
	    > $(DESTDIR)$(PKGCONFIGDIR)/ringd.pc
	chmod 644 $(DESTDIR)$(PKGCONFIGDIR)/ringd.pc
	install -m 644 deploy/ringd.conf $(DESTDIR)$(SYSCONFDIR)/ringd/ringd.conf
	install -m 644 README.md $(DESTDIR)$(DOCDIR)/README.md

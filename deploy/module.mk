# deploy/: the systemd unit, the example config and ringd.pc. Installed
# files name installed paths: the unit's ExecStart and config, the .pc's
# libdir and includedir are rewritten for PREFIX, BINDIR, SYSCONFDIR,
# LIBDIR and INCLUDEDIR (DESTDIR only stages the tree).
INSTALL_TARGETS += install-deploy
.PHONY: install-deploy
install-deploy: $(BUILD)/ringd.service $(BUILD)/ringd.pc
	install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PKGCONFIGDIR) \
	    $(DESTDIR)$(SYSCONFDIR)/ringd $(DESTDIR)$(DOCDIR) \
	    $(DESTDIR)$(SYSUSERSDIR)
	install -m 644 $(BUILD)/ringd.service $(DESTDIR)$(UNITDIR)/ringd.service
	install -m 644 deploy/ringd.sysusers $(DESTDIR)$(SYSUSERSDIR)/ringd.conf
	install -m 644 $(BUILD)/ringd.pc $(DESTDIR)$(PKGCONFIGDIR)/ringd.pc
	install -m 644 deploy/ringd.conf $(DESTDIR)$(SYSCONFDIR)/ringd/ringd.conf
	install -m 644 README.md $(DESTDIR)$(DOCDIR)/README.md

# The unit in the tree names /usr/local/bin/ringd and /etc/ringd (what a
# plain make install gives); the installed one names this install's.
$(BUILD)/ringd.service: deploy/ringd.service Makefile
	@mkdir -p $(dir $@)
	$(Q)sed -e 's|/usr/local/bin/ringd|$(BINDIR)/ringd|' \
	    -e 's|/etc/ringd/|$(SYSCONFDIR)/ringd/|g' \
	    -e 's|/usr/local/share/doc/ringd|$(DOCDIR)|' $< > $@

$(BUILD)/ringd.pc: deploy/ringd.pc.in Makefile daemon/dmn.h
	@mkdir -p $(dir $@)
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@DOCDIR@|$(DOCDIR)|' \
	    -e "s|@VERSION@|$$(sed -n 's/^#define DMN_VERSION \"\(.*\)\"/\1/p' \
	        daemon/dmn.h)|" $< > $@
